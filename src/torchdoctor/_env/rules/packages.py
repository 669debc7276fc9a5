"""Environment rules about installed packages: companions built for another torch (torchvision, torchaudio, xformers,
triton), IPEX beside the wrong torch or ipex-llm, old bitsandbytes, distributions installed twice, stray CUDA wheels.

Registered in the one registry of ``torchdoctor._env.rules.registry`` (which imports this module, so importing either one
registers every rule); like all rules, pure functions of the facts.

>>> from torchdoctor._env.rules.registry import run_rules
>>> facts = {"torch": {"version": "2.3.0+cpu", "build": "cpu"}, "packages": {"intel_extension_for_pytorch": "2.1.100+cpu"}}
>>> [f.code for f in run_rules(facts)]
['ipex_torch_mismatch', 'cpu_only_build']
"""

from __future__ import annotations

from torchdoctor._env.rules.registry import (
    ERROR,
    INFO,
    WARNING,
    Facts,
    EnvFinding,
    env_var,
    has_nvidia,
    hit,
    pkg,
    rule,
    torch_v,
    wheel_index,
)
from torchdoctor._env.versions import local, pins, public, release, satisfies, tag_family


@rule("ipex_beside_ipex_llm")
def _ipex_llm(f: Facts) -> list[EnvFinding]:
    ipex, llm = pkg(f, "intel-extension-for-pytorch"), pkg(f, "ipex-llm")
    if not ipex or not llm:
        return []
    wanted = pins(f, "ipex-llm", "intel-extension-for-pytorch", extras=True)
    if wanted and any(satisfies(ipex, w) for w in wanted):
        return []
    said = f"it pins IPEX {' or '.join(sorted(set(wanted)))}" if wanted else "it brings its own IPEX (none for ipex-llm[xpu_2.6])"
    return hit("ipex_beside_ipex_llm", ERROR if wanted or tag_family(local(ipex)) == "cpu" else WARNING,
               f"intel_extension_for_pytorch {ipex} is installed beside ipex-llm {llm}, but {said}: ipex-llm's XPU ops then "
               "dispatch through the wrong IPEX and can run on the CPU backend ('Could not run ... from the CPU backend').",
               "pip uninstall -y intel-extension-for-pytorch && pip install --force-reinstall --pre 'ipex-llm[xpu]' "
               "--extra-index-url https://pytorch-extension.intel.com/release-whl/stable/xpu/us/")


@rule("ipex_in_cuda_env")
def _ipex_cuda(f: Facts) -> list[EnvFinding]:
    ipex = pkg(f, "intel-extension-for-pytorch")
    if not ipex or not (f["torch"]["build"] == "cuda" or has_nvidia(f)):
        return []
    return hit("ipex_in_cuda_env", WARNING,
               f"intel_extension_for_pytorch {ipex} is installed in an NVIDIA/CUDA environment: transformers, accelerate and "
               "diffusers see IPEX and may take XPU or IPEX-CPU code paths instead of CUDA.",
               "pip uninstall -y intel-extension-for-pytorch")


@rule("ipex_torch_mismatch")
def _ipex_torch(f: Facts) -> list[EnvFinding]:
    ipex, tv = pkg(f, "intel-extension-for-pytorch"), torch_v(f)
    if not ipex or not release(tv) or release(ipex)[:2] == release(tv)[:2]:
        return []
    mm = ".".join(map(str, release(ipex)[:2]))
    return hit("ipex_torch_mismatch", ERROR,
               f"intel_extension_for_pytorch {ipex} needs torch {mm}.*, but torch {tv} is installed: importing IPEX fails or "
               "its kernels are not registered.",
               f"pip install 'torch=={mm}.*'  # or the IPEX release built for torch {'.'.join(map(str, release(tv)[:2]))}")


@rule("xformers_torch_mismatch")
def _xformers(f: Facts) -> list[EnvFinding]:
    xf, tv = pkg(f, "xformers"), torch_v(f)
    bad = [p for p in pins(f, "xformers", "torch") if xf and release(tv) and not satisfies(tv, p)]
    if not bad:
        return []
    return hit("xformers_torch_mismatch", ERROR,
               f"xformers {xf} was built for torch{bad[0]}, but torch {tv} is installed: its C++/CUDA kernels do not load "
               "and memory-efficient attention falls back or fails ('xFormers can't load C++/CUDA extensions').",
               f"pip install --force-reinstall xformers --index-url https://download.pytorch.org/whl/{wheel_index(f)}"
               "  # the build that matches your torch")


_SYMPTOM = {"torchvision": "'operator torchvision::nms does not exist'", "torchaudio": "'libtorchaudio.so: undefined symbol'"}


def _companion(code: str, dist: str) -> None:
    """torchvision / torchaudio: their ``torch==`` pin and their wheel's build tag must match torch's."""

    @rule(code)
    def check(f: Facts) -> list[EnvFinding]:
        dv, tv = pkg(f, dist), torch_v(f)
        if not dv or not release(tv):
            return []
        problems = [f"it requires torch{p}" for p in pins(f, dist, "torch") if p.startswith("==") and not satisfies(tv, p)]
        mine, theirs = tag_family(local(dv)), tag_family(local(tv)) or f["torch"]["build"]
        seen = (f.get("host") or {}).get("wheels", {}).get(dist) or {}
        if mine is None and seen.get("build") in ("cuda", "rocm") and theirs and seen["build"] != theirs:
            # PyPI wheels carry no +cuXXX tag: the files say what was built (a CUDA torchvision beside a CPU torch)
            problems.append(f"it is a {seen['build'].upper()} build ({seen['evidence']}) and torch is a "
                            f"{theirs.upper()} build")
        elif mine and theirs and mine != theirs:
            problems.append(f"it is a {mine.upper()} wheel (+{local(dv)}) and torch is a {theirs.upper()} build")
        elif mine == "cuda" and f["torch"]["cuda"] and local(dv)[2:4] != "".join(f["torch"]["cuda"].split("."))[:2]:
            problems.append(f"it was built for another CUDA major version (+{local(dv)}, torch has CUDA {f['torch']['cuda']})")
        if not problems:
            return []
        r = release(tv) + (0,)
        match = f"0.{r[1] + 15}" if dist == "torchvision" else f"{r[0]}.{r[1]}"  # the release trains move together
        return hit(code, ERROR,
                   f"{dist} {dv} does not match torch {tv}: {'; '.join(problems)}. `import {dist}` fails ({_SYMPTOM[dist]}), "
                   "and so do transformers/peft imports that load it.",
                   f"pip install --force-reinstall torch=={public(tv)} '{dist}=={match}.*' "
                   f"--index-url https://download.pytorch.org/whl/{wheel_index(f)}  # or: pip uninstall -y {dist}")


_companion("torchvision_torch_mismatch", "torchvision")
_companion("torchaudio_torch_mismatch", "torchaudio")


@rule("triton_torch_mismatch")
def _triton(f: Facts) -> list[EnvFinding]:
    for name in ("triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        have = pkg(f, name)
        bad = [p for p in pins(f, "torch", name) if have and not satisfies(have, p)]
        if bad:
            return hit("triton_torch_mismatch", WARNING,
                       f"torch {torch_v(f)} requires {name}{bad[0]}, but {name} {have} is installed: torch.compile / inductor "
                       "kernels fail to build or import.",
                       f"pip install '{name}{bad[0]}'")
    return []


@rule("bnb_old_multi_gpu")
def _bnb_multi(f: Facts) -> list[EnvFinding]:
    bnb = pkg(f, "bitsandbytes")
    count = f["cuda_device_count"]  # visible devices: inferred from the inventory and CUDA_VISIBLE_DEVICES, or probed
    if not bnb or not release(bnb) or satisfies(bnb, ">=0.45.3") or count < 2:  # 0.45.3.dev0 still has the bug
        return []
    return hit("bnb_old_multi_gpu", WARNING,
               f"bitsandbytes {bnb} with {count} GPUs: before 0.45.3, Params4bit.to() leaves quant_state.code on the first GPU, "
               "so a 4-bit layer moved to cuda:1 fails or computes with tensors on two devices.",
               "pip install -U 'bitsandbytes>=0.45.3'")


@rule("bnb_cuda_version_override")
def _bnb_cuda(f: Facts) -> list[EnvFinding]:
    value, cuda = env_var(f, "BNB_CUDA_VERSION"), f["torch"]["cuda"]
    if value is None or not pkg(f, "bitsandbytes") or not cuda or value == "".join(cuda.split(".")[:2]):
        return []
    return hit("bnb_cuda_version_override", WARNING,
               f"BNB_CUDA_VERSION={value} makes bitsandbytes load its CUDA {value} library while torch uses CUDA {cuda}.",
               "unset BNB_CUDA_VERSION")


@rule("duplicate_distributions")
def _duplicates(f: Facts) -> list[EnvFinding]:
    dup = {n: vs for n, vs in f["duplicates"].items() if len(set(vs)) > 1}
    if not dup:
        return []
    listed = "; ".join(f"{n} {' and '.join(vs)}" for n, vs in sorted(dup.items()))
    return hit("duplicate_distributions", WARNING,
               f"Installed twice in different site-packages (user site and venv?): {listed}. The first on sys.path is imported, "
               "tools may read the other's metadata.",
               f"python -m pip uninstall {' '.join(sorted(dup))}  # repeat until gone, then reinstall once")


@rule("nvidia_wheels_without_cuda_torch")
def _nvidia_wheels(f: Facts) -> list[EnvFinding]:
    names = sorted(n for n in f["packages"] if n.startswith("nvidia-") and n not in ("nvidia-ml-py", "nvidia-ml-py3"))
    if not names or f["torch"]["build"] == "cuda" or not f["torch"]["build"]:
        return []
    return hit("nvidia_wheels_without_cuda_torch", INFO,
               f"{len(names)} NVIDIA CUDA wheels ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) are installed but "
               f"torch {torch_v(f)} is a {f['torch']['build'].upper()} build: leftovers of a CUDA torch (gigabytes), "
               "or a package pulled them in.",
               f"pip uninstall -y {' '.join(names)}")
