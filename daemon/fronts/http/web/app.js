// herald kiosk page: speak text through POST tts/stream and play it while it arrives.
//
// The response is a WAV of unknown length: a header, then PCM as the server synthesizes it.
// Each block read from the stream becomes an AudioBufferSourceNode started exactly where
// the previous one ends, so playback begins with the first block rather than at the end.
// Timestamps of the last KEPT_REQUESTS requests are kept on window.heraldStats (the browser
// test reads them); a kiosk page stays open for months, so older ones are let go.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const LEAD_SECONDS = 0.15; // jitter cushion: the first block waits this long for the next
  const PEAKS_PER_SECOND = 200; // waveform resolution
  const MIN_VIEW_SECONDS = 6; // the waveform's time axis grows beyond this as audio arrives
  const KEPT_REQUESTS = 50; // requests whose timestamps window.heraldStats keeps

  const stats = (window.heraldStats = {
    requests: [], last: null, voices: [], kept: KEPT_REQUESTS,
  });
  let audioCtx = null;
  let current = null; // the request being played
  let voices = [];

  // ---------------------------------------------------------------- server calls

  function authHeaders(extra = {}) {
    const token = $("token").value.trim();
    return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
  }

  async function errorMessage(resp) {
    try {
      const body = await resp.json();
      if (body && body.error) return body.error;
    } catch (e) { /* not JSON */ }
    return `${resp.status} ${resp.statusText}`;
  }

  async function loadVoices() {
    let resp;
    try {
      resp = await fetch("voices", { headers: authHeaders() });
    } catch (e) {
      setStatus("server unreachable");
      showError(`Cannot reach herald: ${e.message}`);
      return;
    }
    if (resp.status === 401) {
      $("token-box").open = true;
      setStatus("access token needed");
      showError("This herald needs an access token: enter it under “Access token”.");
      return;
    }
    if (!resp.ok) {
      showError(await errorMessage(resp));
      return;
    }
    voices = await resp.json();
    stats.voices = voices;
    const select = $("voice");
    select.replaceChildren(...voices.map((v) => {
      const opt = new Option(v.name, v.name); // Piper names say language and quality
      opt.selected = v.default;
      return opt;
    }));
    updateSpeakers();
    showError("");
    setStatus(`${voices.length} voice${voices.length === 1 ? "" : "s"} ready`);
  }

  function updateSpeakers() {
    const voice = voices.find((v) => v.name === $("voice").value);
    const many = voice && voice.speakers > 1;
    $("speaker-field").hidden = !many;
    if (!many) return $("speaker").replaceChildren();
    const names = voice.speaker_names.length
      ? voice.speaker_names
      : Array.from({ length: voice.speakers }, (_, i) => String(i));
    $("speaker").replaceChildren(...names.map((n) => new Option(n, n)));
  }

  // ---------------------------------------------------------------- WAV stream parsing

  function ascii(bytes, at, n) {
    return String.fromCharCode(...bytes.subarray(at, at + n));
  }

  // The format and where the PCM starts, or null while more header bytes are needed.
  function parseWavHeader(bytes) {
    if (bytes.length < 12) return null;
    if (ascii(bytes, 0, 4) !== "RIFF" || ascii(bytes, 8, 4) !== "WAVE") {
      throw new Error("the server did not send a WAV stream");
    }
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let pos = 12;
    let fmt = null;
    while (pos + 8 <= bytes.length) {
      const id = ascii(bytes, pos, 4);
      const size = view.getUint32(pos + 4, true);
      if (id === "data") {
        if (!fmt) throw new Error("WAV stream has no fmt chunk before its data");
        return { ...fmt, dataOffset: pos + 8 };
      }
      if (pos + 8 + size > bytes.length) return null;
      if (id === "fmt ") {
        fmt = {
          encoding: view.getUint16(pos + 8, true),
          channels: view.getUint16(pos + 10, true),
          rate: view.getUint32(pos + 12, true),
          bits: view.getUint16(pos + 22, true),
        };
        if (fmt.encoding !== 1 || fmt.bits !== 16) {
          throw new Error(`unsupported WAV encoding ${fmt.encoding}/${fmt.bits} bit`);
        }
      }
      pos += 8 + size + (size & 1);
    }
    return null;
  }

  function concat(a, b) {
    const out = new Uint8Array(a.length + b.length);
    out.set(a, 0);
    out.set(b, a.length);
    return out;
  }

  // s16le interleaved -> one Float32Array per channel
  function toFloat(bytes, channels) {
    const frames = bytes.length / 2 / channels;
    const ints = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    const out = Array.from({ length: channels }, () => new Float32Array(frames));
    for (let i = 0; i < frames; i++) {
      for (let c = 0; c < channels; c++) out[c][i] = ints[i * channels + c] / 32768;
    }
    return out;
  }

  // ---------------------------------------------------------------- playback

  function schedule(req, channels) {
    const frames = channels[0].length;
    const buffer = audioCtx.createBuffer(channels.length, frames, req.format.rate);
    channels.forEach((data, c) => buffer.copyToChannel(data, c));
    const source = audioCtx.createBufferSource();
    source.buffer = buffer;
    source.connect(audioCtx.destination);
    const now = audioCtx.currentTime;
    if (req.nextTime === null) {
      req.nextTime = now + LEAD_SECONDS;
      req.startCtxTime = req.nextTime;
    } else if (req.nextTime < now) { // the stream fell behind playback: a gap is heard
      req.underruns += 1;
      req.nextTime = now + 0.02;
    }
    source.start(req.nextTime);
    req.nextTime += buffer.duration;
    req.sources.add(source);
    const first = req.firstAudioAt === null;
    if (first) {
      req.firstAudioAt = performance.now();
      req.firstAudioMs = req.firstAudioAt - req.sentAt;
    }
    source.onended = () => {
      req.sources.delete(source);
      if (first) req.firstPlayedAt = performance.now();
      if (req.responseDoneAt !== null && req.sources.size === 0) finishPlayback(req);
    };
    req.audioSeconds += buffer.duration;
    addPeaks(req, channels[0]);
  }

  function finishPlayback(req) {
    if (req.playbackDoneAt !== null) return;
    req.playbackDoneAt = performance.now();
    if (current === req) setBusy(false);
  }

  function stop() {
    if (!current) return;
    current.controller.abort();
    for (const s of current.sources) {
      try { s.stop(); } catch (e) { /* not started yet */ }
    }
    current.sources.clear();
    current.stopped = true;
    setBusy(false);
  }

  // ---------------------------------------------------------------- one request

  async function speak(event) {
    event.preventDefault();
    const text = $("text").value;
    if (!text.trim()) return showError("Type something to say first.");
    stop();
    showError("");
    audioCtx = audioCtx || new AudioContext();
    await audioCtx.resume();

    const speed = Number($("speed").value);
    const body = { text, voice: $("voice").value || undefined, rate: +(1 / speed).toFixed(3) };
    if (!$("speaker-field").hidden) body.speaker = $("speaker").value;

    const req = {
      text, voice: body.voice || "", id: null, status: null, error: null, format: null,
      sentAt: performance.now(), firstByteAt: null, firstAudioAt: null, firstAudioMs: null,
      firstPlayedAt: null, responseDoneAt: null, playbackDoneAt: null, audioClockAtDone: null,
      audioSeconds: 0, rtf: null, underruns: 0, peaks: [],
      nextTime: null, startCtxTime: null, sources: new Set(),
      controller: new AbortController(), stopped: false,
    };
    stats.requests.push(req);
    stats.requests.splice(0, stats.requests.length - KEPT_REQUESTS);
    stats.last = req;
    current = req;
    setBusy(true);
    showStats(req);

    try {
      const resp = await fetch("tts/stream", {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json" }),
        body: JSON.stringify(body),
        signal: req.controller.signal,
      });
      req.status = resp.status;
      req.id = resp.headers.get("X-Herald-Id");
      if (!resp.ok) {
        if (resp.status === 401) $("token-box").open = true;
        throw new Error(await errorMessage(resp));
      }
      await play(req, resp.body.getReader());
      req.responseDoneAt = performance.now();
      req.audioClockAtDone = audioCtx.currentTime; // past startCtxTime: it played meanwhile
      req.rtf = (req.responseDoneAt - req.sentAt) / 1000 / req.audioSeconds;
      if (req.sources.size === 0) finishPlayback(req);
    } catch (e) {
      if (req.stopped) return;
      req.error = e.message;
      showError(e.message);
      setBusy(false);
    } finally {
      showStats(req);
      addHistory(req);
    }
  }

  async function play(req, reader) {
    let pending = new Uint8Array(0);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (req.firstByteAt === null) req.firstByteAt = performance.now();
      pending = concat(pending, value);
      if (!req.format) {
        req.format = parseWavHeader(pending);
        if (!req.format) continue;
        pending = pending.subarray(req.format.dataOffset);
      }
      const frameBytes = 2 * req.format.channels;
      const usable = pending.length - (pending.length % frameBytes);
      if (usable === 0) continue;
      schedule(req, toFloat(pending.subarray(0, usable), req.format.channels));
      pending = pending.slice(usable);
      showStats(req);
    }
    if (!req.format) throw new Error("the response ended before any audio");
  }

  // ---------------------------------------------------------------- waveform

  function addPeaks(req, samples) {
    const step = Math.max(1, Math.round(req.format.rate / PEAKS_PER_SECOND));
    for (let i = 0; i < samples.length; i += step) {
      let lo = 0;
      let hi = 0;
      const end = Math.min(samples.length, i + step);
      for (let j = i; j < end; j++) {
        if (samples[j] < lo) lo = samples[j];
        if (samples[j] > hi) hi = samples[j];
      }
      req.peaks.push(lo, hi);
    }
  }

  let drawn = null; // what the canvas shows now, to skip redrawing an idle page

  function draw() {
    requestAnimationFrame(draw);
    const canvas = $("wave");
    const ratio = window.devicePixelRatio || 1;
    const width = Math.round(canvas.clientWidth * ratio);
    const height = Math.round(canvas.clientHeight * ratio);
    const req = current;
    const playing = req && req.playbackDoneAt === null && !req.stopped;
    const key = `${width}x${height}:${req ? req.peaks.length : 0}:${req && req.stopped}`;
    if (!playing && key === drawn) return;
    drawn = key;
    if (canvas.width !== width || canvas.height !== height) {
      canvas.width = width;
      canvas.height = height;
    }
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    if (req && req.peaks.length) {
      const style = getComputedStyle(document.documentElement);
      const count = req.peaks.length / 2;
      const seconds = Math.max(MIN_VIEW_SECONDS, count / PEAKS_PER_SECOND);
      const perPixel = (seconds * PEAKS_PER_SECOND) / width;
      const played = audioCtx && req.startCtxTime !== null
        ? (audioCtx.currentTime - req.startCtxTime) * PEAKS_PER_SECOND : 0;
      const mid = height / 2;
      for (let x = 0; x < width; x++) {
        const a = Math.floor(x * perPixel);
        if (a >= count) break;
        const b = Math.min(count, Math.max(a + 1, Math.floor((x + 1) * perPixel)));
        let lo = 0;
        let hi = 0;
        for (let k = a; k < b; k++) {
          lo = Math.min(lo, req.peaks[2 * k]);
          hi = Math.max(hi, req.peaks[2 * k + 1]);
        }
        g.fillStyle = a < played && !req.stopped
          ? style.getPropertyValue("--wave-played") : style.getPropertyValue("--wave");
        const top = mid - hi * mid * 0.95;
        g.fillRect(x, top, 1, Math.max(1, mid - lo * mid * 0.95 - top));
      }
    }
  }

  // ---------------------------------------------------------------- DOM

  function setStatus(text) { $("status").textContent = text; }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  function setBusy(busy) {
    $("speak").disabled = busy;
    $("stop").disabled = !busy;
    setStatus(busy ? "speaking…" : "ready");
  }

  const fmtMs = (ms) => (ms === null ? "–" : `${Math.round(ms)} ms`);
  const fmtRtf = (r) => (r === null || !isFinite(r) ? "–" : r.toFixed(2));
  const fmtSec = (s) => (s ? `${s.toFixed(1)} s` : "–");

  function showStats(req) {
    $("first-audio").textContent = fmtMs(req.firstAudioMs);
    $("rtf").textContent = fmtRtf(req.rtf);
    $("audio-length").textContent = fmtSec(req.audioSeconds);
    $("underruns").textContent = req.firstAudioAt === null ? "–" : String(req.underruns);
  }

  function addHistory(req) {
    const row = document.createElement("tr");
    const cells = [
      [req.error ? `⚠ ${req.error}` : req.text, "text"],
      [req.voice || "default", ""],
      [fmtMs(req.firstAudioMs), "num"],
      [fmtRtf(req.rtf), "num"],
      [fmtSec(req.audioSeconds), "num"],
    ];
    for (const [value, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      if (cls) td.className = cls;
      if (cls === "text") td.title = req.text;
      row.append(td);
    }
    $("history").prepend(row);
    while ($("history").rows.length > 8) $("history").deleteRow(-1);
  }

  // ---------------------------------------------------------------- wiring

  $("speak-form").addEventListener("submit", speak);
  $("stop").addEventListener("click", stop);
  $("voice").addEventListener("change", updateSpeakers);
  $("speed").addEventListener("input", () => {
    $("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;
  });
  $("token").value = localStorage.getItem("herald.token") || "";
  $("token").addEventListener("change", () => {
    localStorage.setItem("herald.token", $("token").value.trim());
    loadVoices();
  });
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("speak-form").requestSubmit();
  });
  requestAnimationFrame(draw);
  loadVoices();
})();
