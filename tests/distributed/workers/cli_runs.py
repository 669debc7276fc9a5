"""Run under torchrun: several ``torchdoctor ... --distributed`` command lines in one launch, in-process, recording
per rank what each printed and returned (``OUTDIR/rank<R>.json``). The process group is initialised here once (a
group created by the program is used as is); the command creating its own is tested by a real ``-m torchdoctor``
launch.

What torchdoctor prints is kept apart from what other libraries log: a root logging handler takes every record of
a logger outside ``torchdoctor`` (bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" on
its AVX512-BF16 import branch, for one) into ``library_log``, where Python's last-resort handler would have written
it to the captured stderr."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys

import torch.distributed as dist

from torchdoctor._cli.main import main as cli

TARGETS = os.path.join(os.path.dirname(__file__), "targets.py")
RUNS = {
    "scan_clean": ({}, ["scan", f"{TARGETS}:model", "--distributed"]),
    "scan_float64_on_rank_1": ({"TD_BUG_RANK": "1", "TD_BUG": "float64"}, ["scan", f"{TARGETS}:model", "--distributed"]),
    "scan_json_raise_on_rank_0": ({"TD_BUG_RANK": "0", "TD_BUG": "raise"},
                                  ["scan", f"{TARGETS}:model", "--distributed", "--json"]),
    "simulate_clean": ({}, ["simulate", f"{TARGETS}:target", "--distributed", "--device", "cuda"]),
    "scan_checkpoint_path": ({}, ["scan", TARGETS, "--distributed"]),
}


class _Library(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "torchdoctor" or record.name.startswith("torchdoctor."):
            sys.stderr.write(self.format(record) + "\n")  # torchdoctor's own: where the user would see it
        else:
            self.lines.append(f"{record.name}: {record.getMessage()}")


def main() -> None:
    dist.init_process_group("gloo")
    record(sys.argv[1])
    dist.barrier()
    dist.destroy_process_group()


def record(out: str) -> None:
    """Every run of ``RUNS`` on this rank, in the initialised process group, into ``OUT/rank<R>.json``."""
    rank = int(os.environ["RANK"])
    results = {}
    library = _Library()
    logging.getLogger().addHandler(library)
    for name, (env, argv) in RUNS.items():
        os.environ.pop("TD_BUG_RANK", None)
        os.environ.pop("TD_BUG", None)
        os.environ.update(env)
        sys.modules.pop("_torchdoctor_target_targets", None)  # each run imports the target afresh
        stdout, stderr = io.StringIO(), io.StringIO()
        library.lines = []
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli(argv)
        results[name] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                         "library_log": library.lines}
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    with open(os.path.join(out, f"rank{rank}.branch"), "w", encoding="utf-8") as fh:
        import bitsandbytes.backends.cpu.ops as cpu_ops  # the branch bitsandbytes took at import, as it records it

        fh.write("avx512bf16" if hasattr(cpu_ops, "gemm_4bit_forward_kernel") else "portable")
    logging.getLogger().removeHandler(library)


if __name__ == "__main__":
    main()
