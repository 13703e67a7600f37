"""The DataKit graph driver as a child process: what `marin datakit run` and the experiment screens start.

The driver, ``python -m assets.datakit.run --spec JSON``, lives in the definition layer
(assets/datakit/run.py), which the library never imports: it runs as a process started from
an argv list (no shell), with the run's ``RunSpec`` as one JSON argument. Its exit status is
the caller's to judge: 0 with the summary line printed on its stdout, 1 for bad input, a
failed wave, a prefix in use or a run that kept nothing.
"""

from __future__ import annotations

import codecs
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from marin_assets.datakit.run_spec import RunSpec

DRIVER = "assets.datakit.run"


def driver_argv(spec: RunSpec) -> list[str]:
    """The driver's command line for ``spec``: this interpreter, the module, the spec as JSON."""
    return [sys.executable, "-m", DRIVER, "--spec", spec.to_json()]


def run_driver(spec: RunSpec, stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run the driver on ``spec``; return its exit status.

    Its stderr (progress, errors) is relayed to ``stderr`` as it comes and its stdout (the
    summary line) to ``stdout``; each defaults to this process's own stream.
    """
    proc = subprocess.Popen(driver_argv(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def relay(stream, out: IO[str]) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a chunk may end inside a character
        for chunk in iter(lambda: stream.read1(65536), b""):
            out.write(decoder.decode(chunk))
            out.flush()
        out.write(decoder.decode(b"", final=True))

    errors = threading.Thread(target=relay, args=(proc.stderr, stderr or sys.stderr), daemon=True)
    errors.start()
    relay(proc.stdout, stdout or sys.stdout)
    errors.join()
    return proc.wait()
