"""Planted bugs: each a one-snippet change to the real source, applied in-process for the
length of a ``with`` block. A fuzz target is only worth what it catches; the teeth test
asserts that each target's smoke campaign finds every bug planted in the code it covers."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import sys
import tempfile
from dataclasses import dataclass

PACKAGES = ("reference", "fast", "fuzz")


@dataclass(frozen=True)
class Mutant:
    """A planted bug: ``old`` replaced by ``new`` in ``module``, and the campaign
    (``target``) that must find it."""

    name: str
    target: str  # the campaign that must find it
    module: str
    old: str
    new: str
    gpu_only: bool = False  # its code runs on GPUs only: a CPU run cannot find it


MUTANTS = [
    Mutant(
        "tie order by rank, not page",
        "reference",
        "reference.cp",
        "    best = top_keys(torch.where(cands == PENDING, 0, cands).view(rows * hr, cp * TOPK), RANKED)\n",
        "    flat = torch.where(cands == PENDING, 0, cands).view(rows * hr, cp * TOPK)\n"
        "    best = flat.gather(1, torch.sort(flat >> 16, dim=-1, descending=True, stable=True).indices[:, :RANKED])\n",
    ),
    Mutant(
        "causal cut one page late",
        "reference",
        "reference.cp",
        "return torch.minimum(((own + cp - 1 - rank) // cp).clamp(min=0), n_local)",
        "return torch.minimum(((own + cp - rank) // cp).clamp(min=0), n_local)",
    ),
    Mutant(
        "compact width without its extra column",
        "reference",
        "reference.cp",
        "    return -(-num_pages // cp) + 1\n",
        "    return -(-num_pages // cp)\n",
    ),
    Mutant(
        "two-level select keeps only the best group",
        "reference",
        "reference.selection",
        "    kept = members.amax(dim=-1).topk(TOPK, dim=-1).indices  # [R, 16]\n",
        "    kept = members.amax(dim=-1).topk(1, dim=-1).indices.expand(rows, TOPK)\n",
    ),
    Mutant(
        "merge does not re-arm the q tile",
        "kernels",
        "fast.kernels.cp",
        "    tl.store(tile + hw, tl.full([H * WORDS], -1, tl.int32))\n",
        "    tl.store(tile + hw, tl.load(tile + hw))\n",
    ),
    Mutant(
        "query slots from the front",
        "kernels",
        "fast.kernels.cp",
        "    b, _, slot = row_query(t, QLEN)\n    seq = tl.load(seq_lens_ptr + b)\n",
        "    b, slot, _ = row_query(t, QLEN)  # slot = i: from the front\n    seq = tl.load(seq_lens_ptr + b)\n",
    ),
    Mutant(
        "own page not forced into slot 15",
        "kernels",
        "fast.kernels.cp",
        "    tl.store(dst, tl.where(k[None, :] == RANKED, own, keys_to_pages(best)))\n",
        "    tl.store(dst, keys_to_pages(best))\n",
    ),
    Mutant(
        "msa output descending",
        "msa-reference",
        "reference.msa.selection",
        "    chosen = torch.where(chosen < 0, _LAST, chosen).sort(dim=1).values\n",
        "    chosen = torch.where(chosen < 0, _LAST, chosen).sort(dim=1, descending=True).values\n",
    ),
    Mutant(
        "msa local window one block short",
        "msa-reference",
        "reference.msa.selection",
        "    return (blocks < n) & ((blocks < init_blocks) | (blocks >= n - local_blocks))\n",
        "    return (blocks < n) & ((blocks < init_blocks) | (blocks >= n - local_blocks + 1))\n",
    ),
    Mutant(
        "msa rank scores its columns as the first blocks",
        "msa-reference",
        "reference.msa.cp",
        "num_pages=p, stride=cp, offset=r, mma=mma)",
        "num_pages=p, mma=mma)",
    ),
    Mutant(
        "msa scorer masks its own token",
        "msa-kernels",
        "fast.msa.kernels.scorer_dot",
        "            visible = (g * _PAGE + t[:, None]) <= pos[None, :]\n",
        "            visible = (g * _PAGE + t[:, None]) < pos[None, :]\n",
    ),
    Mutant(
        "msa mma scorer masks its own token",
        "msa-kernels",
        "fast.msa.kernels.scorer_mma",
        "                visible = (g * _PAGE + 64 * (k % 2) + t_idx)[:, None] <= pos[None, :]\n",
        "                visible = (g * _PAGE + 64 * (k % 2) + t_idx)[:, None] < pos[None, :]\n",
        gpu_only=True,
    ),
    Mutant(
        "nvfp4 page ring reads the next slot's codes",
        "kernels",
        "fast.kernels.page_ring",
        "        _CODES[2 * (NTH % RING) + HALF],",
        "        _CODES[2 * ((NTH + 1) % RING) + HALF],",
        gpu_only=True,
    ),
    Mutant(
        "msa ring read back without the tensor copies' swizzle",
        "msa-kernels",
        "fast.msa.kernels.block_ring",
        "    if SWIZZLED:\n",
        "    if False:\n",
        gpu_only=True,
    ),
    Mutant(
        "msa stock candidates overlap the local window",
        "msa-kernels",
        "fast.msa.kernels.stock",
        "    hi = tl.minimum(n - local, P)\n",
        "    hi = tl.minimum(n - local + 1, P)\n",
    ),
    Mutant(
        "msa push keys not shifted back to their blocks",
        "msa-kernels",
        "fast.msa.kernels.cp",
        "_push(tl.where(best > 0, best - lo * CP, 0), dst, healthy)",
        "_push(best, dst, healthy)",
    ),
    Mutant(
        "msa exchange takes a bf16 0xFF byte for unwritten",
        "msa-kernels",
        "fast.kernels.device",
        "    if HALVES:\n",
        "    if False:\n",
    ),
    Mutant(
        "msa merge takes one candidate too many",
        "msa-kernels",
        "fast.msa.kernels.cp",
        "    m = _TOPK - init - local  # the candidates a row takes\n",
        "    m = _TOPK - init - local + 1  # the candidates a row takes\n",
    ),
    Mutant(
        "msa rank's candidates start one column early",
        "msa-kernels",
        "fast.msa.kernels.cp",
        "    lo = _columns_below(init, CP, RANK)\n",
        "    lo = _columns_below(tl.maximum(init - 1, 0), CP, RANK)\n",
    ),
]


@contextlib.contextmanager
def applied(mutant: Mutant):
    """Re-execute the mutant's module from mutated source, and rebind every name other
    modules of the project imported from it; restore everything on exit."""
    module = importlib.import_module(mutant.module)
    source = inspect.getsource(module)
    if source.count(mutant.old) != 1:
        raise ValueError(
            f"mutant {mutant.name!r}: its snippet occurs {source.count(mutant.old)} times in {mutant.module}"
        )
    saved = dict(module.__dict__)
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        # Triton reads a kernel's source from its file: give the mutated code a real one.
        path = os.path.join(tmp, mutant.module.replace(".", "_") + ".py")
        with open(path, "w") as f:
            f.write(source.replace(mutant.old, mutant.new))
        rebound = []
        try:
            exec(compile(open(path).read(), path, "exec"), module.__dict__)
            changed = {
                id(old): module.__dict__[name]
                for name, old in saved.items()
                if module.__dict__.get(name) is not old and not name.startswith("__")
            }
            # every other holder of a replaced object: the package's modules, and the classes
            # they define (a class attribute names a kernel, as MsaDecodeCP.MERGE_OUTPUT does)
            holders = [
                holder
                for other in list(sys.modules.values())
                if other is not module and getattr(other, "__name__", "").startswith(PACKAGES)
                for holder in (other, *(v for v in vars(other).values() if isinstance(v, type)))
            ]
            for holder in holders:
                for attr, value in list(vars(holder).items()):
                    if id(value) in changed:
                        rebound.append((holder, attr, value))
                        setattr(holder, attr, changed[id(value)])
            yield
        finally:
            for other, attr, value in rebound:
                setattr(other, attr, value)
            # Put every original name back, but delete nothing: the Triton interpreter adds
            # its own globals to a kernel's module when it first runs the kernel, and its
            # cached kernels need them.
            module.__dict__.update(saved)


def hunt(name: str, seed: int = 0) -> dict:
    """Plant mutant ``name`` and run its target's smoke campaign until its first failure (not
    shrunk: the question is whether the campaign finds the bug); a summary dict."""
    from .runner import run_campaign

    mutant = next(m for m in MUTANTS if m.name == name)
    with applied(mutant):
        result = run_campaign(mutant.target, smoke=True, seed=seed, database=False, quiet=True, shrink=False)
    return {
        "mutant": name,
        "target": mutant.target,
        "found": result.found,
        "examples": result.examples,
        "failure": result.failure,
        "replay": result.replay,
    }


if __name__ == "__main__":
    # One mutant per process: Triton's interpreter caches rewritten kernels, so a planted
    # kernel bug is only reliably undone by ending the process.
    print(json.dumps(hunt(sys.argv[1])))
