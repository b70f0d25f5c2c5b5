"""Which parts of ``daemon/`` may load which: the configuration loads no sink and no front
(reading a configuration must not depend on how audio leaves), and the fleet loads no front
(it talks to the broker through the MQTT plumbing in ``daemon/mqtt``, as the MQTT front does),
and loading a voice loads no ONNX library.
Each check imports in a fresh interpreter, so nothing another test loaded counts."""

from __future__ import annotations

from fresh_python import run_python


def loaded_after(code: str, *prefixes: str) -> list[str]:
    """The modules under ``prefixes`` that are loaded once ``code`` has run."""
    probe = (f"{code}\nimport sys\n"
             f"print(' '.join(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))")
    return run_python(probe).stdout.split()


def test_the_settings_load_no_sink_and_no_front() -> None:
    assert loaded_after("import daemon.settings", "daemon.sinks", "daemon.fronts") == []


def test_the_fleet_loads_no_front() -> None:
    code = ("import importlib, pkgutil, daemon.fleet\n"
            "for m in pkgutil.iter_modules(daemon.fleet.__path__):\n"
            "    importlib.import_module('daemon.fleet.' + m.name)")
    assert "daemon.fleet.node" in loaded_after(code, "daemon.fleet")
    assert loaded_after(code, "daemon.fronts") == []


def test_loading_a_voice_imports_neither_onnx_nor_its_dtypes() -> None:
    """A voice's file is read by protobuf (``tts.onnx_file``): ``onnx`` imports
    ``ml_dtypes``, most of a second of every start, for a file read once."""
    code = "from tts import VoiceCatalog\nVoiceCatalog().synthesizer()"
    assert loaded_after(code, "onnx", "ml_dtypes") == []
