"""Checkpoint inspection cost: a 2 GB safetensors file is scanned from its header alone.

The file is sparse (header written, then ``truncate`` to full size), so it costs no disk and any accidental
read of tensor data would show up as time and RSS. Run: ``python bench/checkpoint.py [--gib 2] [--tensors 4000]``.
``--bombs [--src OLD/src]`` times the hostile files of ``tests/checkpoint/hostile.py`` in capped child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import tempfile
import time


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def timed(fn, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per call: the machine is shared, so CPU time is the steadier figure."""
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def write_sparse_safetensors(path: str, total_bytes: int, n_tensors: int) -> int:
    per = (total_bytes // n_tensors) // 2 * 2  # bf16 elements
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for i in range(n_tensors):
        layer, kind = divmod(i, 8)
        header[f"model.layers.{layer}.block.{kind}.weight"] = {
            "dtype": "BF16",
            "shape": [per // 2],
            "data_offsets": [offset, offset + per],
        }
        offset += per
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--bombs", action="store_true", help="time the hostile files instead (child processes)")
    ap.add_argument("--src", help="with --bombs or --cli: the src/ directory whose torchdoctor is measured")
    ap.add_argument("--cap-gib", type=float, default=4.0, help="with --bombs: address-space cap per child")
    ap.add_argument("--timeout", type=float, default=120.0, help="with --bombs: seconds before a child is killed")
    ap.add_argument("--cli", action="store_true", help="whole-process `torchdoctor scan FILE` against `import torch`")
    opts = ap.parse_args()
    if opts.bombs:
        bombs(opts)
        return
    if opts.cli:
        cli(opts)
        return

    import torch  # noqa: F401  (import cost is not part of the scan)

    from torchdoctor._checkpoint.scan import scan_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.safetensors")
        size = write_sparse_safetensors(path, int(opts.gib * 1024**3), opts.tensors)
        disk = os.stat(path).st_blocks * 512
        rss_before = peak_rss_mib()
        times, cpu = timed(lambda: scan_checkpoint(path), opts.repeat)
        report = scan_checkpoint(path)
        rss_after = peak_rss_mib()
        assert len(report.tensors) == opts.tensors and report.ok
        print(f"file: {size / 1024**3:.2f} GiB apparent, {disk / 1024**2:.2f} MiB on disk, {opts.tensors} tensors")
        print(f"scan_checkpoint: wall median {statistics.median(times) * 1000:.1f} ms (min {min(times) * 1000:.1f}), "
              f"CPU median {statistics.median(cpu) * 1000:.1f} ms, over {opts.repeat} runs (target < 100 ms)")
        print(f"peak RSS: {rss_before:.0f} MiB before, {rss_after:.0f} MiB after (+{rss_after - rss_before:.1f} MiB)")
        print(f"bytes of the file per ms of scanning: {size / 1024**2 / (statistics.median(times) * 1000):.0f} MiB/ms")

        # The pickle path: a torch.save zip with as many (tiny) tensors, walked by the restricted unpickler.
        import torch

        pt = os.path.join(tmp, "many.pt")
        torch.save({f"model.layers.{i // 8}.block.{i % 8}.weight": torch.zeros(1, dtype=torch.bfloat16)
                    for i in range(opts.tensors)}, pt)
        times, cpu = timed(lambda: scan_checkpoint(pt), opts.repeat)
        assert len(scan_checkpoint(pt).tensors) == opts.tensors
        print(f"torch.save zip with {opts.tensors} tensors: wall median {statistics.median(times) * 1000:.1f} ms, "
              f"CPU median {statistics.median(cpu) * 1000:.1f} ms "
              f"({statistics.median(cpu) * 1e6 / opts.tensors:.1f} us per tensor)")
        # Against a baseline in the same process, interleaved: torch's own weights_only load of the same file
        # (mmap, no data copied). The machine is shared, so the ratio of medians over many rounds is the figure.
        ratios = []
        for _ in range(opts.rounds):
            (t_scan,), _c = timed(lambda: scan_checkpoint(pt), 1)
            (t_load,), _c = timed(lambda: torch.load(pt, weights_only=True, mmap=True), 1)
            ratios.append(t_scan / t_load)
        print(f"scan_checkpoint / torch.load(weights_only=True, mmap=True), {opts.rounds} interleaved rounds: "
              f"median x{statistics.median(ratios):.2f} (quartiles x{statistics.quantiles(ratios, n=4)[0]:.2f}"
              f"..x{statistics.quantiles(ratios, n=4)[2]:.2f})")


def cli(opts: argparse.Namespace) -> None:
    """The pre-commit hook's cost: ``torchdoctor scan model.safetensors``, a 1 MB legacy pickle (3,000 tensors) and
    the same state dict in the zip form, as whole processes interleaved with ``python -c "import torch"`` (the
    anchor), ``--repeat`` rounds; medians of wall time and of the child's CPU time (user + system, what
    ``bench/table.py`` reads). Twice: compiling
    torchdoctor's modules every time (``PYTHONDONTWRITEBYTECODE=1`` and no cache, as in this workplace), and with
    bytecode cached after one warm-up run (as an installed wheel runs: pip writes the ``.pyc`` files)."""
    import subprocess
    import sys
    from pathlib import Path

    import shutil

    root = Path(__file__).resolve().parents[1]
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    with tempfile.TemporaryDirectory() as tmp:
        for copy in ("src-compiled", "src-cached"):  # two copies of the code: a cache written for one never
            shutil.copytree(opts.src or root / "src", os.path.join(tmp, copy),  # serves the other
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        st = os.path.join(tmp, "model.safetensors")
        write_sparse_safetensors(st, 64 * 1024**2, 400)
        pkl = os.path.join(tmp, "onemb.pt")
        subprocess.run([sys.executable, "-c", "import torch, sys; torch.save({f'l{i}.w': torch.zeros(64) for i in "
                        "range(3000)}, sys.argv[1], _use_new_zipfile_serialization=False)", pkl], check=True)
        pkz = os.path.join(tmp, "onemb_zip.pt")  # the same state dict in torch.save's zip form
        subprocess.run([sys.executable, "-c", "import torch, sys; torch.save({f'l{i}.w': torch.zeros(64) for i in "
                        "range(3000)}, sys.argv[1])", pkz], check=True)
        modes = {"no bytecode": {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.path.join(tmp, "src-compiled")},
                 "bytecode": {**base, "PYTHONPATH": os.path.join(tmp, "src-cached")}}

        def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, _status, ru = os.wait4(p.pid, 0)
            return time.perf_counter() - t0, ru.ru_utime + ru.ru_stime

        cmds = {"import torch": [sys.executable, "-c", "import torch"],
                "scan model.safetensors": [sys.executable, "-m", "torchdoctor", "scan", st],
                f"scan onemb.pt ({os.path.getsize(pkl) / 1e6:.2f} MB legacy, 3,000 tensors)":
                    [sys.executable, "-m", "torchdoctor", "scan", pkl],
                f"scan onemb_zip.pt ({os.path.getsize(pkz) / 1e6:.2f} MB zip, the same 3,000 tensors)":
                    [sys.executable, "-m", "torchdoctor", "scan", pkz]}
        for cmd in cmds.values():  # warm-up: writes the bytecode cache of the "bytecode" mode
            run(cmd, modes["bytecode"])
        wall: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(opts.repeat):
            order = list(cmds.items()) if i % 2 == 0 else list(reversed(cmds.items()))
            for mode, env in modes.items():
                for name, cmd in order:
                    w, c = run(cmd, env)
                    wall.setdefault((mode, name), []).append(w)
                    cpu.setdefault((mode, name), []).append(c)
        med = statistics.median
        print(f"{opts.repeat} interleaved rounds, load average {os.getloadavg()[0]:.1f} at the end")
        for mode in modes:
            torch_cpu = cpu[(mode, "import torch")]
            for name in cmds:
                w, c = wall[(mode, name)], cpu[(mode, name)]
                ratio = statistics.median(a / b for a, b in zip(c, torch_cpu))
                print(f"{mode:12} {name:50} wall median {med(w):.3f} s (min {min(w):.3f}), CPU median {med(c):.3f} s "
                      f"(min {min(c):.3f}), CPU ratio to import torch x{ratio:.3f}")


def bombs(opts: argparse.Namespace) -> None:
    """Each hostile file of the test suite, scanned by ``python -m torchdoctor scan`` in a child process under an
    address-space cap and a timeout; wall time, peak RSS and exit code per file. ``--src`` picks the code."""
    import subprocess
    import sys
    from pathlib import Path

    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("hostile", root / "tests" / "checkpoint" / "hostile.py")
    assert spec is not None and spec.loader is not None
    hostile = importlib.util.module_from_spec(spec)  # the same builders the tests use
    spec.loader.exec_module(hostile)

    src = opts.src or str(root / "src")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        import torch

        files = {"baseline-good.pt": hostile.torch_zip({"w": torch.zeros(2)}),  # start-up cost of the child
                 "memo-12-bytes.pkl": hostile.memo_bomb(), "nested-blobs.pkl": hostile.nested_bomb(6, 8),
                 "wide-blobs.pkl": hostile.wide_blob_bomb(100_000)}
        for name, data in files.items():
            (d / name).write_bytes(data)
        hostile.zip_declaring(d / "zip-byteorder-3gib.pt")
        for path in sorted(d.iterdir()):
            cap = int(opts.cap_gib * 1024**3)

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

            env = {**os.environ, "PYTHONPATH": src}
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", "scan", str(path)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit)
            status, usage, timed_out = None, None, False
            while status is None:
                pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    status, usage = st, ru
                elif time.perf_counter() - t0 > opts.timeout:
                    proc.kill()
                    _, status, usage = os.wait4(proc.pid, 0)
                    timed_out = True
                else:
                    time.sleep(0.05)
            wall = time.perf_counter() - t0
            err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
            code = "killed at timeout" if timed_out else f"exit {os.waitstatus_to_exitcode(status)}"
            print(f"{path.name:24} {wall:7.1f} s  peak RSS {usage.ru_maxrss / 1024:7.0f} MiB  {code}  "
                  f"{(err[-1] if err else '')[:110]}")


if __name__ == "__main__":
    main()
