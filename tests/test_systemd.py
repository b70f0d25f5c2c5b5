"""systemd integration: the unit's hardening, sd_notify over a real socket, the watchdog
contract, journald fields and stderr logging, and herald working inside the unit's sandbox.

The sandbox test runs this file as a script (``python tests/test_systemd.py sandbox ...``):
it installs, with libseccomp, the same seccomp filters systemd derives from the unit
(SystemCallFilter, RestrictAddressFamilies, MemoryDenyWriteExecute), then loads the voice,
synthesizes and plays through PortAudio/ALSA. Without systemd as PID 1 on the test machine
that is as close to "run the unit" as it gets.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, NotifySocket
from fresh_python import run_python

UNIT = ROOT / "systemd" / "herald.service"


def unit_values(key: str) -> list[str]:
    return [line.split("=", 1)[1].strip() for line in UNIT.read_text().splitlines()
            if line.startswith(f"{key}=")]


# ------------------------------------------------------------------------------ the unit

def test_unit_exposure_is_at_most_2() -> None:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is not installed: run scripts/setup --test")
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager",
                           str(UNIT)], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for herald\.service: (\d+(?:\.\d+)?)",
                  proc.stdout + proc.stderr)
    assert m, f"no exposure level in the output:\n{proc.stdout}\n{proc.stderr}"
    assert float(m.group(1)) <= 2.0, proc.stdout


def test_unit_is_a_notify_service_with_a_watchdog() -> None:
    assert unit_values("Type") == ["notify"]
    assert unit_values("NotifyAccess") == ["main"]
    assert unit_values("WatchdogSec") == ["30"]
    assert unit_values("ExecStart") == [
        "/opt/herald/.venv/bin/herald run --config /etc/herald/herald.toml"]
    assert unit_values("Restart") == ["on-failure"]
    assert unit_values("PrivateDevices") == ["no"], "a private /dev hides /dev/snd"
    assert "char-alsa rw" in unit_values("DeviceAllow")


# ------------------------------------------------------------------------- sd_notify

@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify")
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def test_ready_status_stopping_reach_the_notify_socket(notify_socket: NotifySocket) -> None:
    from daemon import systemd

    assert systemd.ready("serving on 10200") is True
    assert systemd.status("speaking,\n2 queued") is True
    assert systemd.stopping() is True
    assert notify_socket.received(2.0) == ["READY=1\nSTATUS=serving on 10200",
                                           "STATUS=speaking, 2 queued", "STOPPING=1"]


def test_fallback_writer_speaks_the_same_protocol(notify_socket: NotifySocket,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon import systemd

    assert systemd._notify_socket("STATUS=by hand") is True
    assert notify_socket.received(2.0) == ["STATUS=by hand"]
    # Abstract-namespace sockets are written "@name" in NOTIFY_SOCKET.
    name = f"herald-test-{os.getpid()}"
    abstract = NotifySocket("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd._notify_socket("READY=1") is True
        assert abstract.received(2.0) == ["READY=1"]
    finally:
        abstract.close()


def test_notifications_are_no_ops_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon import systemd

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert systemd.ready() is False and systemd.watchdog_ping() is False
    assert systemd.watchdog_enabled() is False and systemd.watchdog_interval() is None


def test_watchdog_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from daemon import systemd

    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval() == 30.0 and systemd.watchdog_enabled()
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert systemd.watchdog_interval() is None and not systemd.watchdog_enabled()


async def test_watchdog_pets_only_while_work_progresses(
        notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The watchdog looks every interval/2 and pets only if herald is idle or made progress
    within stall_after. The test doesn't guess how many looks fit into a stretch of time:
    busy() is called once per look, so the test sees every look and whether it petted (a
    look's datagram is in the socket before the next look). A busy machine only makes the
    test slower. The one comparison of times, "it did not give up before stall_after had
    passed", only gets easier when the loop runs late."""
    from daemon import systemd

    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # WatchdogSec=0.2: a look every 0.1 s
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    busy = True
    looks: list[bool | None] = []  # per look: did it pet? None until the next look or drain
    sent: list[str] = []

    def collect() -> None:
        """Move what the watchdog sent into ``sent``; settles the latest look's outcome."""
        got = notify_socket.received()
        sent.extend(got)
        if looks and looks[-1] is None:
            looks[-1] = "WATCHDOG=1" in got
        else:
            assert not got, f"sent without a look: {got}"

    def is_busy() -> bool:
        collect()
        looks.append(None)
        return busy

    async def until(condition: Callable[[], object], what: str) -> None:
        try:
            async with asyncio.timeout(30):  # a hang guard, not a time limit on the watchdog
                while True:
                    collect()
                    if condition():
                        return
                    await asyncio.sleep(0.01)
        except TimeoutError:
            pytest.fail(f"no {what} within 30 s; looks: {looks}")

    def logged(text: str, since: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records[since:] if text in r.getMessage()]

    caplog.set_level(logging.INFO, logger="herald.systemd")
    dog = systemd.Watchdog(busy=is_busy)
    assert dog.interval == 0.2 and dog.stall_after == 0.2  # stall_after: the whole interval
    progressing = True
    last_progress = 0.0  # wall clock (as log records have it), taken just before progress()

    async def work() -> None:  # a synthesis making progress, chunk after chunk
        nonlocal last_progress
        while progressing:
            last_progress = time.time()
            dog.progress()
            await asyncio.sleep(0.02)

    worker = asyncio.create_task(work())
    dog.start()
    try:
        # Busy and progressing: it pets (and the latest look did, so it isn't giving up).
        await until(lambda: looks.count(True) >= 3 and looks[-1] is True,
                    "pets while progressing")

        # Busy, no progress (a hung synthesis): it gives up, says so, and pets no more.
        mark = len(caplog.records)
        progressing = False
        await worker
        await until(lambda: looks[-1] is False, "a look without a pet while stuck")
        gave_up = logged("no longer petting", mark)
        assert gave_up and gave_up[0].levelno == logging.ERROR, caplog.text
        assert gave_up[0].created - last_progress > dog.stall_after, "gave up too early"
        stuck = len(looks)
        await until(lambda: len(looks) >= stuck + 3 and looks[-1] is not None, "3 more looks")
        assert not any(looks[stuck - 1:]), "petted while stuck"

        # Progress again: pets resume, and the log says so.
        mark = len(caplog.records)
        progressing = True
        worker = asyncio.create_task(work())
        await until(lambda: looks[-1] is True, "pets after progress")
        assert logged("progressing again", mark)
        progressing = False
        await worker

        # Idle (nothing in flight): healthy however long ago the last progress was, so
        # every look pets.
        busy = False
        idle = len(looks)
        await until(lambda: len(looks) >= idle + 3 and looks[-1] is not None, "3 idle looks")
        assert all(looks[idle:]), f"an idle look did not pet: {looks[idle:]}"
        assert set(sent) == {"WATCHDOG=1"}
    finally:
        progressing = False
        await dog.stop()
        await worker


# ------------------------------------------------------------------------------ logging

LOGGING_SCRIPT = """
import logging, sys
from daemon.systemd import setup_logging
logging.basicConfig(level=logging.DEBUG)  # an earlier set-up must not log twice
setup_logging(sys.argv[1])
log = logging.getLogger("herald.test")
log.debug("hidden")
log.info("spoke %d chunks", 12, extra={"request_id": "req-7"})
log.warning("plain")
"""


def test_stderr_logging_is_readable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("INVOCATION_ID", "JOURNAL_STREAM", "NOTIFY_SOCKET")}
    proc = run_python(LOGGING_SCRIPT, "INFO", env=env, timeout=30)
    lines = proc.stderr.splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert len(lines) == 2, lines
    assert re.fullmatch(stamp + r" INFO herald\.test: \[req-7\] spoke 12 chunks", lines[0])
    assert re.fullmatch(stamp + r" WARNING herald\.test: plain", lines[1])


def parse_journal_datagram(data: bytes) -> dict[str, str]:
    """journald's native protocol: FIELD=value lines, or FIELD\\n<le64 size><bytes>\\n."""
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, value = line.split(b"=", 1)
            i = nl + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            value = data[nl + 9:nl + 9 + size]
            i = nl + 9 + size + 1
        fields[key.decode()] = value.decode()
    return fields


JOURNAL_SCRIPT = """
import json, logging, os, socket
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind("/run/systemd/journal/socket")
from daemon.systemd import setup_logging
handler = setup_logging("INFO")
log = logging.getLogger("herald.test")
log.warning("spoke %d chunks", 12, extra={"request_id": "req-7", "voice": "joe"})
sock.settimeout(5)
print(json.dumps({"handler": type(handler).__name__, "datagram": sock.recv(65536).hex()}))
"""


CONTEXT_SCRIPT = """
import asyncio, json, logging, socket
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind("/run/systemd/journal/socket")
from daemon.logs import context_for, request_context
from daemon.systemd import setup_logging
setup_logging("INFO")
log = logging.getLogger("herald.test")
with request_context("req-8"):
    log.info("in a front")
async def work():
    log.info("in the request's task")
async def main():
    await asyncio.create_task(work(), context=context_for("req-9"))
    log.info("outside any request")
asyncio.run(main())
sock.settimeout(5)
print(json.dumps([sock.recv(65536).hex() for _ in range(3)]))
"""


def run_with_private_journal(script: str) -> str:
    """``script``'s output, run with a private /run/systemd whose journal socket it binds."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a private /run/systemd")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespaces here: {probe.stderr.decode().strip()}")
    env = dict(os.environ, INVOCATION_ID="0123456789abcdef0123456789abcdef")
    env.pop("JOURNAL_STREAM", None)
    shell = ("mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/journal && "
             f'exec "{sys.executable}" -c "$0"')
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell, script], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_journald_gets_the_request_id_from_the_log_context() -> None:
    """No call site passes ``extra=``: the request being served gives the journal its
    HERALD_REQUEST_ID, in the front's code and in the tasks started for the request."""
    datagrams = json.loads(run_with_private_journal(CONTEXT_SCRIPT))
    fields = [parse_journal_datagram(bytes.fromhex(d)) for d in datagrams]
    assert [(f["MESSAGE"], f.get("HERALD_REQUEST_ID")) for f in fields] == [
        ("in a front", "req-8"), ("in the request's task", "req-9"),
        ("outside any request", None)]


def test_journald_gets_herald_fields(tmp_path: Path) -> None:
    # A private mount namespace with its own /run/systemd, so the test's journald socket
    # is the one libsystemd writes to, without touching the machine's.
    result = json.loads(run_with_private_journal(JOURNAL_SCRIPT))
    assert result["handler"] == "JournalHandler"
    fields = parse_journal_datagram(bytes.fromhex(result["datagram"]))
    assert fields["MESSAGE"] == "spoke 12 chunks"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "herald"
    assert fields["LOGGER"] == "herald.test"
    assert fields["HERALD_REQUEST_ID"] == "req-7"
    assert fields["HERALD_VOICE"] == "joe"


# ---------------------------------------------------------------- the unit's sandbox

def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"],
                         capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.startswith("    ") and not line.strip().startswith("#") and line.strip():
            current.append(line.strip())
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        out |= expand(groups[name], groups) if name.startswith("@") else {name}
    return out


def unit_sandbox() -> dict[str, object]:
    """What systemd would filter for this unit, read from the unit file itself."""
    groups = syscall_groups()
    allowed: set[str] = set()
    for value in unit_values("SystemCallFilter"):
        if value.startswith("~"):
            allowed -= expand(value[1:].split(), groups)
        else:
            allowed |= expand(value.split(), groups)
    families = [f for v in unit_values("RestrictAddressFamilies") for f in v.split()]
    return {"allowed": sorted(allowed), "families": families,
            "mdwe": unit_values("MemoryDenyWriteExecute") == ["yes"]}


def test_herald_runs_inside_the_units_sandbox(tmp_path: Path, alsa_file) -> None:  # type: ignore[no-untyped-def]
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is not installed: run scripts/setup --test")
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        pytest.fail("libseccomp is not installed: run scripts/setup --test")
    spec = tmp_path / "sandbox.json"
    spec.write_text(json.dumps(unit_sandbox()))  # read from the unit file
    proc = subprocess.run([sys.executable, __file__, "sandbox", str(spec)], cwd=ROOT,
                          env=alsa_file.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.splitlines()[-1])
    # The filters are really in force...
    sandbox = unit_sandbox()
    assert result["wx_mmap"] == ("EPERM" if sandbox["mdwe"] else "ok")
    assert result["setpriority"] == "EPERM", "@resources not filtered"
    assert result["setaffinity"] == "ok", "tts.sharing cannot keep its threads apart"
    assert result["packet_socket"] == "EAFNOSUPPORT", "RestrictAddressFamilies not in force"
    # ...and herald still synthesizes, talks TCP and plays through PortAudio/ALSA.
    assert result["tcp_echo"] == "ok"
    assert result["played_samples"] == result["synth_samples"] > 0.3 * 22050
    from audio_checks import assert_speech, pcm16

    assert_speech(pcm16(alsa_file.pcm()), 22050, min_seconds=0.3)


# -------------------------------------------------------- the sandboxed process itself

class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def install_filters(allowed: list[str], families: list[str], mdwe: bool) -> None:
    """The filters systemd installs for the unit (SystemCallErrorNumber=EPERM)."""
    import mmap

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    allow, eq, ge, masked_eq = 0x7FFF0000, 4, 5, 7

    def errno_action(code: int) -> int:
        return 0x00050000 | code

    def rule(ctx: int, action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not a syscall on this architecture
        arr = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
        if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
            raise OSError(f"seccomp rule for {name} failed")

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS (NoNewPrivileges=yes)
        raise OSError("PR_SET_NO_NEW_PRIVS failed")
    # RestrictAddressFamilies and MemoryDenyWriteExecute: a filter that allows by default.
    ctx = lib.seccomp_init(allow)
    keep = {getattr(socket, f) for f in families}
    for family in range(0, 46):
        if family not in keep:
            rule(ctx, errno_action(97), "socket", (0, eq, family, 0))  # EAFNOSUPPORT
    rule(ctx, errno_action(97), "socket", (0, ge, 46, 0))
    if mdwe:
        wx = mmap.PROT_WRITE | mmap.PROT_EXEC
        for name in ("mmap", "mmap2"):
            rule(ctx, errno_action(1), name, (2, masked_eq, wx, wx))
        for name in ("mprotect", "pkey_mprotect"):
            rule(ctx, errno_action(1), name, (2, masked_eq, mmap.PROT_EXEC, mmap.PROT_EXEC))
        rule(ctx, errno_action(1), "shmat", (2, masked_eq, 0o100000, 0o100000))  # SHM_EXEC
    assert lib.seccomp_load(ctx) == 0
    # SystemCallFilter: an allow list, everything else fails with EPERM. Loaded last: it
    # denies seccomp() itself, as systemd's filters do once the service runs.
    ctx = lib.seccomp_init(errno_action(1))
    for name in allowed:
        rule(ctx, allow, name)
    assert lib.seccomp_load(ctx) == 0


def _errno_name(fn) -> str:  # type: ignore[no-untyped-def]
    import errno

    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e))


def sandbox_main(spec_path: str) -> None:
    import mmap

    spec = json.loads(Path(spec_path).read_text())
    install_filters(spec["allowed"], spec["families"], spec["mdwe"])
    result: dict[str, object] = {}
    libc = ctypes.CDLL(None, use_errno=True)

    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]

    def wx_mmap() -> None:
        prot = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        ptr = libc.mmap(None, 4096, prot, 0x22, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS
        if ptr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap")

    result["wx_mmap"] = _errno_name(wx_mmap)
    result["setpriority"] = _errno_name(lambda: os.setpriority(
        os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1))
    result["setaffinity"] = _errno_name(lambda: os.sched_setaffinity(
        0, os.sched_getaffinity(0)))
    result["packet_socket"] = _errno_name(lambda: socket.socket(socket.AF_PACKET,
                                                                 socket.SOCK_RAW).close())

    def tcp_echo() -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:
            with socket.create_connection(server.getsockname()) as client:
                conn, _ = server.accept()
                client.sendall(b"ping")
                assert conn.recv(4) == b"ping"
                conn.close()

    result["tcp_echo"] = _errno_name(tcp_echo)

    # The real work: load the voice, synthesize, play through PortAudio into ALSA.
    from daemon.jobs.metrics import Metrics
    from daemon.settings import SpeakerSettings
    from daemon.sinks.speaker import SpeakerSink
    from tts import AudioFormat, SynthesisOptions, VoiceCatalog, prepare_process, to_pcm16

    prepare_process()
    synth = VoiceCatalog().synthesizer()
    pcm = b"".join(to_pcm16(c.samples) for c in synth.stream("Hello from the sandbox.",
                                                            SynthesisOptions(seed=1)))
    result["synth_samples"] = len(pcm) // 2

    async def play() -> int:
        sink = SpeakerSink(SpeakerSettings(), Metrics())
        await sink.start()

        async def chunks():  # type: ignore[no-untyped-def]
            for i in range(0, len(pcm), 4096):
                yield pcm[i:i + 4096]

        stats = await sink.play(AudioFormat(synth.sample_rate), chunks())
        await sink.stop()
        return stats.samples

    result["played_samples"] = asyncio.run(play())
    print(json.dumps(result))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "sandbox":
    sys.path.insert(0, str(ROOT))
    logging.basicConfig(level=logging.WARNING)
    sandbox_main(sys.argv[2])
    sys.stdout.flush()
