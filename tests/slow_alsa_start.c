/* A sound card whose driver is slow to start: preloaded (LD_PRELOAD) into a process that
 * plays through ALSA, it makes the first start of a PCM (snd_pcm_start) on each of the first
 * SLOW_ALSA_STARTS threads that start one take SLOW_ALSA_START_SECONDS longer, then starts the
 * PCM as usual. PortAudio calls it on the new audio thread of every stream it starts and gives
 * that thread one second to get going, so a delay over a second makes PortAudio refuse the
 * start ("Wait timed out"), which is what a host too busy to run the thread in time does
 * (tests/test_speaker_start.py). A thread's later starts (PortAudio restarting the PCM after
 * an underrun, which a loaded host brings) are not held: they are not a stream's start, and
 * counting them would let a start meant to be refused through. ALSA's own start runs
 * unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct _snd_pcm snd_pcm_t;

int snd_pcm_start(snd_pcm_t *pcm)
{
    static atomic_int calls;
    static __thread int depth; /* a plugin starts its slave PCM through here too */
    static __thread int started; /* this thread has started a PCM before */
    /* PortAudio is loaded with dlopen (by sounddevice), libasound with it, out of
     * RTLD_NEXT's reach: look it up in the library that is loaded already. */
    void *alsa = dlopen("libasound.so.2", RTLD_LAZY | RTLD_NOLOAD);
    int (*start)(snd_pcm_t *) = (int (*)(snd_pcm_t *))dlsym(alsa, "snd_pcm_start");
    const char *slow = getenv("SLOW_ALSA_STARTS"), *seconds = getenv("SLOW_ALSA_START_SECONDS");
    int first = depth == 0 && !started;
    if (depth == 0)
        started = 1;
    if (first && slow && seconds && atomic_fetch_add(&calls, 1) < atoi(slow)) {
        double s = atof(seconds);
        struct timespec delay = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        while (nanosleep(&delay, &delay) != 0) {
        }
    }
    if (alsa)
        dlclose(alsa); /* the reference NOLOAD took; the library stays loaded */
    depth++;
    int err = start(pcm);
    depth--;
    return err;
}
