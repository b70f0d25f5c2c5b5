"""glibc's heap as ``tts.memory`` sets it up: what the flow and the generator free between
pieces stays mapped for the next piece, instead of being handed back to the system and
faulted in again.

Counted in page faults (``getrusage``), not in time, so the verdict does not depend on how
fast or busy the machine is. A fresh process, as a daemon's: the streamed flow and
generator over 400 frames in windows of 96, on a worker thread (its own arena) and on the
main thread (a helper's heap), each decoded twice to grow the heap to what a decode needs,
then five decodes counted. The figure is the fewest faults of the five: a piece handed back
and faulted in again does so in every decode, while a heap still settling grows in one
decode or another whatever the threshold (on the main thread, hundreds to thousands of
faults in the third to tenth decode), and some decodes fault 2 MiB or 4 MiB in that neither
heap growth nor the resident set shows (a mapping made and unmapped within the decode). A
median of five was the piece's size or more in a third of the runs on one host.

Herald's count must stay under one generator piece's pages: a single piece handed back and
faulted in again each decode would reach it. On the worker thread the same thread then puts
glibc's own trim threshold back and counts five more decodes, which shows that the count
sees the hand-backs: there they recur decode after decode (2,000 to 22,000 faults; the
fewest of five 4,561 on the host above). Not on the main thread: whether glibc trims the
main heap at its own threshold depends on what else the thread allocated on top of the
freed pieces, and that differs from one CPU's kernels to another's (thousands of faults a
decode on one host, none in most decodes on another)."""

from __future__ import annotations

import json

import pytest
from fresh_python import run_python

CODE = """
import ctypes, json, resource, sys, threading
import torch
from tts import VoiceCatalog, prepare_process
from tts.flow_stream import StreamingFlow
from tts.generator_stream import PIECE, StreamingGenerator
from tts.vits import nhwc

prepare_process()
model = VoiceCatalog().synthesizer().model
frames, window = 400, 96
ROUNDS = 5  # decodes counted: the heap may still grow in some of them, never in all
z = nhwc(torch.randn(1, 192, frames, generator=torch.Generator().manual_seed(0)))
mallopt = ctypes.CDLL(None).mallopt

def faults() -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    with torch.inference_mode():
        flow, gen = StreamingFlow(model.flow, None), StreamingGenerator(model.dec, None)
        for at in range(0, frames, window):
            final = at + window >= frames
            gen.push(flow.push(z[..., at:at + window], final), final)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

def counted(seen: dict, control: bool) -> None:
    faults(), faults()  # as prepare_process left the heap, grown to what a decode needs
    seen["herald"] = min(faults() for _ in range(ROUNDS))
    if control:
        mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD: glibc's default
        faults()
        seen["glibc"] = min(faults() for _ in range(ROUNDS))

seen = {"piece": PIECE * 4 // resource.getpagesize()}
if sys.argv[1] == "worker":
    thread = threading.Thread(target=counted, args=(seen, True))
    thread.start()
    thread.join()
else:
    counted(seen, False)
print(json.dumps(seen))
"""


@pytest.mark.parametrize("where", ["worker", "main"])
def test_freed_pieces_stay_mapped_for_the_next(where: str) -> None:
    out = run_python(CODE, where, timeout=300).stdout
    seen = json.loads(out.splitlines()[-1])
    assert seen["herald"] < seen["piece"], (
        f"a decode on the {where} thread took {seen['herald']} page faults (the fewest of "
        f"five), as many as a {seen['piece']}-page generator piece: freed pieces are still "
        f"handed back and faulted in again")
    if where == "worker":
        assert seen["glibc"] > 1000, (
            f"with glibc's own trim threshold a decode took only {seen['glibc']} page faults "
            f"(the fewest of five): the count does not see the hand-backs")
        assert seen["herald"] * 3 < seen["glibc"], (
            f"a decode took {seen['herald']} page faults (the fewest of five), against "
            f"{seen['glibc']} with glibc's own trim threshold: freed pieces are still handed "
            f"back and faulted in again")
