"""Container-level mutation fuzz, judged against torch itself.

Seeds: torch.save zips and legacy streams (benign and carrying a payload), torch < 0.4 tars (v7 and ustar),
plain pickles. Mutations act on the container, not on bytes at random: duplicate members (a payload copy before
or after the real one), member names changed in case or in the local header only, entries reordered, bytes
before or after the archive (pickle/zip/tar polyglots), tar typeflags turned into links, sizes and magics
rewritten with the checksum recomputed (or not). Every mutant is scanned in process (never a crash: a report or
one CheckpointError line) and loaded by the real loaders in one capped subprocess: ``torch.load`` in both modes
and ``pickle.load``, the payload writing a per-mutant marker. A mutant the scan calls "ok" must be one from which
no loader ran code and that one of them loads (a plain pickle is ``pickle.load``'s; torch.load refuses it). ``TD_FUZZ_MUTANTS`` sets the count
(default 160); a long run: ``TD_FUZZ_MUTANTS=3000``.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import torch

from checkpoint import containers
from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint

MUTANTS = int(os.environ.get("TD_FUZZ_MUTANTS", "160"))


def _payload() -> bytes:
    """``os.system('touch "$TD_MARK"')``: the oracle sets TD_MARK per mutant, so a run is pinned to its file."""
    cmd = b'touch "$TD_MARK"'
    return b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", len(cmd)) + cmd + b"\x85R."


class _Evil:
    def __reduce__(self):  # noqa: ANN204
        return (os.system, ('touch "$TD_MARK"',))


def _seeds() -> dict[str, bytes]:
    sd = {"w": torch.randn(3, 2), "h": torch.zeros(2, dtype=torch.float16)}
    out = {}
    for name, state in (("zip", sd), ("zip-evil", {**sd, "cfg": _Evil()})):
        buf = io.BytesIO()
        torch.save(state, buf)
        out[name] = buf.getvalue()
    buf = io.BytesIO()
    torch.save(sd, buf, _use_new_zipfile_serialization=False)
    out["legacy"] = buf.getvalue()
    mark = "$TD_MARK"
    out["tar-v7"] = containers.v7_tar(mark).replace(containers.evil(mark), _payload())
    out["tar-ustar-benign"] = containers.ustar_tar(mark).replace(containers.evil(mark), pickle.dumps({}, 2))
    out["plain"] = pickle.dumps({"epoch": 3, "w": torch.zeros(2)})
    return out


def _zip_items(data: bytes) -> list[tuple[str, bytes]]:
    z = zipfile.ZipFile(io.BytesIO(data))
    return [(i.filename, z.read(i)) for i in z.infolist()]


def _rezip(items: list[tuple[str, bytes]]) -> bytes:
    return containers._zip(items)


def _zip_mutation(data: bytes, rng: random.Random) -> bytes:
    items = _zip_items(data)
    pkl = next(i for i, (n, _) in enumerate(items) if n.endswith("data.pkl"))
    how = rng.randrange(6)
    if how == 0:  # a duplicate of some member, or a payload copy of data.pkl, before or after
        name, body = items[rng.randrange(len(items))] if rng.random() < 0.5 else (items[pkl][0], _payload())
        items.insert(rng.choice((pkl, len(items))), (name, body))
    elif how == 1:  # a name in another case
        i = rng.randrange(len(items))
        items[i] = (items[i][0].upper() if rng.random() < 0.5 else items[i][0].swapcase(), items[i][1])
    elif how == 2:  # entries reordered: another first entry, so another folder for torch
        rng.shuffle(items)
    elif how == 3:  # the payload in data.pkl, renamed in its local header only
        items[pkl] = (items[pkl][0], _payload())
        raw = bytearray(_rezip(items))
        local = raw.index(items[pkl][0].encode())
        raw[local + len(items[pkl][0]) - 1] ^= 0x20
        return bytes(raw)
    elif how == 4:  # bytes before the archive: a pickle, junk, or a tar header
        lead = rng.choice((_payload(), b"junk" * rng.randint(1, 200), containers.v7_header(b"N.", 0)))
        return lead + _rezip(items)
    else:  # bytes after it
        return _rezip(items) + rng.choice((_payload(), containers.ustar_tar("$TD_MARK"), b"\x00" * 512))
    return _rezip(items)


def _tar_blocks(data: bytes) -> list[int]:
    """Offsets of member headers (walking sizes), as tarfile would."""
    out, pos = [], 0
    while pos + 512 <= len(data) and data[pos:pos + 512].count(0) != 512:
        out.append(pos)
        size = int(data[pos + 124:pos + 136].split(b"\x00")[0].strip() or b"0", 8)
        pos += 512 + (size + 511) // 512 * 512
    return out


def _checksum(raw: bytearray, at: int) -> None:
    raw[at + 148:at + 156] = b" " * 8
    raw[at + 148:at + 156] = b"%06o\x00 " % sum(raw[at:at + 512])


def _tar_mutation(data: bytes, rng: random.Random) -> bytes:
    raw = bytearray(data)
    heads = _tar_blocks(data)
    at = rng.choice(heads)
    how = rng.randrange(6)
    if how == 0:  # a member becomes a link or a directory
        raw[at + 156] = rng.choice(b"1256")
        raw[at + 157:at + 157 + 8] = rng.choice((b"pickle\x00\x00", b"/etc/hos", b"storages"))
    elif how == 1:  # the ustar magic added or removed
        raw[at + 257:at + 265] = rng.choice((b"ustar\x0000", b"ustar  \x00", bytes(8)))
    elif how == 2:  # another size
        raw[at + 124:at + 136] = b"%011o\x00" % rng.choice((0, 1, 512, 10**6, len(data)))
    elif how == 3:  # another name (a duplicate of one of torch's, or a pickle)
        raw[at:at + 100] = rng.choice((b"pickle", b"storages", b"tensors", b"N.", b"cos\nsystem\n")).ljust(100, b"\x00")
    elif how == 4:  # a payload member appended under one of torch's names
        body = _payload()
        tail = containers.v7_header(rng.choice((b"pickle", b"storages")), len(body)) + body + bytes(-len(body) % 512)
        end = heads[-1] + 512 + (int(raw[heads[-1] + 124:heads[-1] + 136].split(b"\x00")[0] or b"0", 8) + 511) // 512 * 512
        raw[end:end] = tail
        return bytes(raw)
    else:  # a pickle written over the start (polyglot), checksum left as it is
        raw[:len(_payload())] = _payload()
        return bytes(raw)
    if rng.random() < 0.85:
        _checksum(raw, at)
    return bytes(raw)


def _polyglot(data: bytes, rng: random.Random) -> bytes:
    how = rng.randrange(3)
    if how == 0:
        return _payload() + data  # a pickle, then a whole checkpoint
    if how == 1:
        return data + _payload()
    head = b"\x80\x02NX\x01\x00\x00\x00{00"  # byte 8 is "{": not a safetensors header
    return head + data[2:] if data[:1] == b"\x80" else head + _payload()[2:]


def _mutants(tmp: Path, n: int) -> list[Path]:
    rng = random.Random(20261129)
    seeds = _seeds()
    names = sorted(seeds)
    files = []
    for k in range(n):
        name = names[k % len(names)]
        seed = seeds[name]
        if name.startswith("zip") and rng.random() < 0.8:
            data = _zip_mutation(seed, rng)
        elif name.startswith("tar") and rng.random() < 0.8:
            data = _tar_mutation(seed, rng)
        else:
            data = _polyglot(seed, rng)
        path = tmp / f"m{k:04d}-{name}.pt"
        path.write_bytes(data)
        files.append(path)
    return files


_ORACLE = r"""
import io, json, os, pickle, resource, signal, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
warnings.simplefilter("ignore")
import torch
def hung(*_):  # a tar member that is a FIFO: torch.load blocks opening it
    raise TimeoutError
signal.signal(signal.SIGALRM, hung)
out = {}
for path in sys.argv[2:]:
    mark = path + ".ran"
    os.environ["TD_MARK"] = mark
    res = {}
    for mode in ("weights_only", "full", "pickle"):
        signal.alarm(20)
        try:
            if mode == "pickle":
                with open(path, "rb") as f:
                    pickle.load(f)
            else:
                torch.load(path, weights_only=(mode == "weights_only"))
            res[mode] = True
        except BaseException:
            res[mode] = False
        signal.alarm(0)
    res["ran"] = os.path.exists(mark)
    out[path] = res
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
"""


def _oracle(files: list[Path], tmp: Path) -> dict[str, dict[str, bool]]:
    result = tmp / "oracle.json"
    done: dict[str, dict[str, bool]] = {}
    todo = [str(f) for f in files]
    while todo:  # a loader that crashes the interpreter ends a batch: go on after that file
        subprocess.run([sys.executable, "-c", _ORACLE, str(result), *todo], capture_output=True, timeout=600,
                       cwd=tmp, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        got = json.loads(result.read_text()) if result.exists() else {}
        done.update(got)
        if len(got) == len(todo):
            break
        crashed = todo[len(got)]
        done[crashed] = {"weights_only": False, "full": False, "pickle": False, "ran": os.path.exists(crashed + ".ran")}
        todo = todo[len(got) + 1:]
        result.unlink(missing_ok=True)
    return done


def _verdict(path: Path) -> str:
    try:
        report = check_checkpoint(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)[:300]
        return "refused"
    return "ok" if report.ok else "problems"


def test_container_mutations_never_crash_and_are_never_falsely_ok(tmp_path, monkeypatch):
    files = _mutants(tmp_path, MUTANTS)
    verdicts = {}
    for path in files:
        monkeypatch.setenv("TD_MARK", str(path) + ".scanned")  # pins a payload that runs to this file
        try:
            verdicts[str(path)] = _verdict(path)
        except AssertionError:
            raise
        except Exception as exc:  # a crash: the failure carries the input to keep as a test
            raise AssertionError(f"{path.name} crashed the reader ({type(exc).__name__}: {exc}); "
                                 f"input: {path.read_bytes()[:2000]!r}") from None
        assert not Path(str(path) + ".scanned").exists()
    oracle = _oracle(files, tmp_path)
    false_ok = [(Path(p).name, oracle[p]) for p, v in verdicts.items() if v == "ok" and (
        oracle[p]["ran"] or not (oracle[p]["weights_only"] or oracle[p]["full"] or oracle[p]["pickle"]))]
    assert not false_ok, false_ok
    ran = sum(o["ran"] for o in oracle.values())
    counts = {v: list(verdicts.values()).count(v) for v in ("ok", "problems", "refused")}
    assert ran >= MUTANTS // 10 and counts["ok"] >= MUTANTS // 20, (ran, counts)  # the fuzz reaches both kinds
