"""Block sizes and launch parameters for the Pallas kernels, per device.

Pure Python (no JAX, no torch): every choice below can be computed and
unit-tested on a machine without the accelerator it is meant for.

Why these numbers
-----------------
GPU: Pallas lowers through Triton (_common.call passes Triton's launch
parameters, which also pins that backend: JAX 0.10 would otherwise pick Mosaic
GPU, which cannot lower these kernels' row reductions). Three hard limits and
one soft one:
  - shared memory per program: 227 KiB on sm_90 (H100/H200; Triton reported
    "available: 232448" on an H200), 163 KiB on sm_80, 99 KiB on sm_86/89/120.
    What a kernel needs is estimated by `*.onchip_bytes` (model below) and
    must fit;
  - Triton refuses any tensor of more than 1,048,576 elements (a
    1024x2048 weight tile failed on the H200 with exactly that message);
  - loaded blocks must have power-of-two sides, and tl.dot wants every
    side >= 16;
  - registers (soft): a float32 tile of R x C elements spread over
    32 * num_warps threads costs R*C / (32*num_warps) registers a thread;
    above ~128 Triton spills. So rms_norm takes a few rows per program at
    D=4096; the old 64 x 4096 tile (2048 floats a thread) is the likely
    reason it reached 4% of the H200's bandwidth.
Shared-memory model (meant as an upper bound; Triton's allocator decides): every
operand of a tl.dot inside a pipelined loop is staged `num_stages` times;
a tile that changes layout (scores feeding a reduction or a second dot)
passes once through shared memory. On a GPU, bench/kernels.py prints the
estimate next to the shared memory Triton reports for each compiled kernel.

TPU (Mosaic). Blocks live in VMEM, double-buffered by the pipeline; the
budget is the default scoped VMEM limit (16 MiB on v4/v5e/v5p; v6e has 32).
Blocks prefer multiples of 128 lanes. Not measured on a TPU here, and the
estimates count only the tiles: the whole-array blocks some kernels take (the
weight in linear_token_logprobs, K/V in attention) must fit VMEM as well,
which bounds V x H on a TPU until those kernels walk the weight by grid.

Interpret mode (CPU) runs the GPU configuration of an H200 by default, so the
CPU tests exercise the very block shapes the GPU compiles.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

TRITON_MAX_BLOCK_ELEMS = 1 << 20  # Triton: "Maximum allowed number of elements is 1048576"
MIN_DOT = 16  # tl.dot needs every side >= 16
MAX_REGS = 128  # float32 accumulator registers a thread may hold before Triton spills


@dataclass(frozen=True)
class Device:
    """What a kernel launch must fit on one kind of device."""

    name: str
    kind: str  # "gpu": Pallas -> Triton; "tpu": Pallas -> Mosaic
    onchip_bytes: int  # per program: GPU shared memory per block (opt-in max); TPU scoped VMEM
    cores: int  # programs that run at once (SMs / TensorCores): sizes grid-strided kernels
    max_block_elems: int | None  # elements one tensor (tile) may have; None: no such limit


H200 = Device("NVIDIA H100/H200 (sm_90)", "gpu", 227 * 1024, 132, TRITON_MAX_BLOCK_ELEMS)
# Any other CUDA GPU: the smallest shared memory of the current generations (sm_86/89/120).
CUDA_GENERIC = Device("CUDA GPU (generic, 99 KiB shared memory)", "gpu", 99 * 1024, 80, TRITON_MAX_BLOCK_ELEMS)
TPU = Device("TPU (16 MiB scoped VMEM)", "tpu", 16 * 2**20, 1, None)

# Opt-in shared memory per block by compute capability (CUDA programming guide, table
# "Technical Specifications per Compute Capability").
_SMEM_KIB = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227,
             (10, 0): 227, (12, 0): 99}


def cuda_device(capability: tuple[int, int], sms: int, name: str = "CUDA GPU") -> Device:
    """The budget of a CUDA GPU from torch.cuda.get_device_capability / multi_processor_count."""
    if tuple(capability) == (9, 0):
        return dataclasses.replace(H200, name=name, cores=sms)
    kib = _SMEM_KIB.get(tuple(capability))
    if kib is None:
        return dataclasses.replace(CUDA_GENERIC, name=name, cores=sms)
    return Device(f"{name} (sm_{capability[0]}{capability[1]})", "gpu", kib * 1024, sms, TRITON_MAX_BLOCK_ELEMS)


A100 = cuda_device((8, 0), 108, "NVIDIA A100")

# Chips named without having them: the lowering tests, bench/gpu_check.sh.
NAMED = {"tpu": TPU, "h200": H200, "a100": A100}


def named_device(name: str) -> Device:
    """The budget of a chip by name ("tpu", "h200", "a100"), for lowering the kernels
    for a chip this machine does not have."""
    if name not in NAMED:
        raise ValueError(f"unknown device {name!r}; valid: {', '.join(NAMED)}")
    return NAMED[name]


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def fit_block(block: int, size: int, floor: int = MIN_DOT) -> int:
    """A power-of-two block no larger than needed for `size` (but >= floor when the
    block allows it: padding a 5-row input to 16 rows is cheaper than a slow dot)."""
    return min(block, max(floor, next_pow2(size)))


def dividing_block(block: int, size: int, floor: int) -> int:
    """The largest power of two <= block that divides size, if >= floor; else block.
    A block that divides the vocabulary saves padding (a copy of the whole logits
    or weight) on every call: 32000, 128256 and 151936 are multiples of 128."""
    b = block
    while b >= floor:
        if size % b == 0:
            return b
        b //= 2
    return block


def _regs(elems: int, num_warps: int) -> float:
    return elems / (32 * num_warps)


class _Blocks(abc.ABC):
    """Shared checks: `fits(device, itemsize, direction)` against memory, tile and register limits."""

    num_warps: int

    @abc.abstractmethod
    def tiles(self, direction: str) -> dict[str, int]:
        """Elements of every tile a program holds; "acc" is the float32 one in registers."""

    @abc.abstractmethod
    def onchip_bytes(self, itemsize: int, direction: str) -> int:
        """Estimated shared memory (GPU) / VMEM (TPU) of one program, inputs of `itemsize` bytes."""

    def fits(self, device: Device, itemsize: int, direction: str) -> bool:
        if self.onchip_bytes(itemsize, direction) > device.onchip_bytes:
            return False
        tiles = self.tiles(direction)
        if device.max_block_elems is not None and max(tiles.values()) > device.max_block_elems:
            return False
        if device.kind == "gpu" and _regs(tiles["acc"], self.num_warps) > MAX_REGS:
            return False
        return True


# ----------------------------------------------------------------- linear_token_logprobs

@dataclass(frozen=True)
class LinearLogprobsBlocks(_Blocks):
    """One program holds `rows` rows; the vocabulary is walked in `vocab` tiles and
    each tile's logits are accumulated over `hidden`-wide slices of H, so no tile
    grows with H or V. `atomics`: the backward is one kernel over (row, vocab) tiles
    that adds into d hidden and d weight with atomic adds (GPU); without atomics (TPU,
    and a deterministic option) two kernels recompute the logits, one per output."""

    rows: int
    vocab: int
    hidden: int
    num_warps: int = 4
    num_stages: int = 2
    atomics: bool = False
    vocab_splits: int = 1  # forward: programs sharing one row block's vocabulary walk
    target: str = "gpu"  # the chip these blocks are for: "gpu" (Triton) or "tpu" (Mosaic); see _common.lowering

    def tiles(self, direction: str) -> dict[str, int]:
        t = {"acc": self.rows * self.vocab, "h": self.rows * self.hidden, "w": self.vocab * self.hidden}
        if direction == "bwd":
            # d logits and the score tile are both live; the output tiles of the two
            # gradients pass one at a time.
            t["acc"] = 2 * self.rows * self.vocab
            t["out"] = max(self.rows, self.vocab) * self.hidden
        return t

    def onchip_bytes(self, itemsize: int, direction: str) -> int:
        # Logits pass: h and w slices staged num_stages times, scores once (float32).
        b = self.num_stages * (self.rows + self.vocab) * self.hidden * itemsize + self.rows * self.vocab * 4
        if direction == "bwd":
            # Gradient pass: d logits as a dot operand, the h / w slices again, and one
            # float32 output tile on its way to memory.
            staged = self.num_stages * (self.rows + self.vocab) * self.hidden * itemsize
            b += self.rows * self.vocab * itemsize + staged + max(self.rows, self.vocab) * self.hidden * 4
        return b


def linear_logprobs_blocks(n: int, h: int, v: int, itemsize: int, device: Device,
                           direction: str) -> LinearLogprobsBlocks:
    """Blocks for linear_token_logprobs on `device` (direction "fwd" or "bwd").

    GPU start: 128x128 logit tiles (an MMA-friendly square, 64 float32 registers a
    thread at 8 warps), H slices of 64 (bf16: four k-steps of a wgmma) or 32 (float32),
    3 pipeline stages. Shrunk in this order until it fits: stages (to 2), the H slice
    (to 32 / 16), then the larger of rows / vocab (to 16). The forward splits the
    vocabulary walk over enough programs for ~4 per SM.
    """
    if device.kind == "tpu":
        # Mosaic wants 128-lane multiples; VMEM is large, so wide tiles.
        cfg = LinearLogprobsBlocks(rows=fit_block(256, n, 8), vocab=fit_block(512, v, 128),
                                   hidden=fit_block(512, h, 128), target="tpu")
    else:
        cfg = LinearLogprobsBlocks(rows=fit_block(128, n), vocab=fit_block(dividing_block(128, v, 32), v),
                                   hidden=fit_block(64 if itemsize <= 2 else 32, h), num_warps=8, num_stages=3,
                                   atomics=True)
    min_hidden = 32 if itemsize <= 2 else MIN_DOT
    while not cfg.fits(device, itemsize, direction):
        if cfg.num_stages > 2:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.hidden > min_hidden:
            cfg = dataclasses.replace(cfg, hidden=cfg.hidden // 2)
        elif max(cfg.rows, cfg.vocab) > MIN_DOT:
            big = "rows" if cfg.rows >= cfg.vocab else "vocab"
            cfg = dataclasses.replace(cfg, **{big: getattr(cfg, big) // 2})
        elif cfg.hidden > MIN_DOT:
            cfg = dataclasses.replace(cfg, hidden=cfg.hidden // 2)
        else:
            raise ValueError(f"no linear_token_logprobs blocks fit {device.name} (H={h}, V={v})")
    if direction == "fwd" and device.kind == "gpu":
        # N=4096 in 128-row blocks is 32 programs: a quarter of an H200's SMs. Splitting
        # the vocabulary walk gives ~4 programs per SM.
        row_blocks, tiles = -(-n // cfg.rows), -(-v // cfg.vocab)
        cfg = dataclasses.replace(cfg, vocab_splits=min(tiles, max(1, -(-4 * device.cores // row_blocks))))
    return cfg


# ----------------------------------------------------------------- flash attention

@dataclass(frozen=True)
class AttentionBlocks(_Blocks):
    """`q` query rows per program; keys walked in `k` blocks; `d` the (padded) head dim."""

    q: int
    k: int
    d: int
    num_warps: int = 4
    num_stages: int = 2
    target: str = "gpu"  # the chip these blocks are for: "gpu" (Triton) or "tpu" (Mosaic); see _common.lowering

    def tiles(self, direction: str) -> dict[str, int]:
        return {"acc": (2 if direction == "bwd" else 1) * self.q * self.k, "q": self.q * self.d,
                "k": self.k * self.d}

    def onchip_bytes(self, itemsize: int, direction: str) -> int:
        q, k, d = self.q, self.k, self.d
        if direction == "fwd":
            # q resident; k and v staged; p as the second dot's operand; scores float32.
            return (q * d + self.num_stages * 2 * k * d + q * k) * itemsize + q * k * 4
        # dk/dv kernel (the larger of the two backward kernels): k, v resident; q and do
        # staged; p and ds as dot operands; two float32 score tiles.
        return (2 * k * d + self.num_stages * 2 * q * d + 2 * q * k) * itemsize + 2 * q * k * 4


def attention_blocks(sq: int, sk: int, d: int, itemsize: int, device: Device, direction: str) -> AttentionBlocks:
    """Blocks for flash_attention, d the (padded) head dim.

    GPU start (FlashAttention-2 / Triton tutorial settings for Hopper): forward
    128 queries x 64 keys, 4 warps up to d=64 and 8 above, 3 stages; backward 64x64
    (it holds twice the tiles). d > 128 halves both. Shrunk until it fits: stages
    (to 2), k (to 32), q (to 64), then stages, k and q to their floors.
    """
    if device.kind == "tpu":
        return AttentionBlocks(q=fit_block(128, sq, 8), k=fit_block(128, sk, 8), d=d, target="tpu")
    if direction == "fwd":
        q, k = (128, 64) if d <= 128 else (64, 32)
        stages = 3
    else:
        q, k = (64, 64) if d <= 128 else (32, 32)
        stages = 2
    cfg = AttentionBlocks(q=fit_block(q, sq), k=fit_block(k, sk), d=d, num_warps=4 if d <= 64 else 8,
                          num_stages=stages)
    while not cfg.fits(device, itemsize, direction):
        if cfg.num_stages > 2:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.k > 32:
            cfg = dataclasses.replace(cfg, k=cfg.k // 2)
        elif cfg.q > 64:
            cfg = dataclasses.replace(cfg, q=cfg.q // 2)
        elif cfg.num_stages > 1:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.k > MIN_DOT:
            cfg = dataclasses.replace(cfg, k=cfg.k // 2)
        elif cfg.q > MIN_DOT:
            cfg = dataclasses.replace(cfg, q=cfg.q // 2)
        else:
            raise ValueError(f"no flash_attention blocks fit {device.name} (head dim {d})")
    return cfg


# ----------------------------------------------------------------- rms_norm

@dataclass(frozen=True)
class RowBlocks(_Blocks):
    """Memory-bound row kernels: `rows` x the whole feature dim per step.
    `programs` (backward): how many programs stride over the row blocks, each
    summing its own d weight partial, so the partials are a few MiB, not [N/rows, D]."""

    rows: int
    d: int
    num_warps: int = 4
    programs: int = 0
    target: str = "gpu"  # the chip these blocks are for: "gpu" (Triton) or "tpu" (Mosaic); see _common.lowering

    def tiles(self, direction: str) -> dict[str, int]:
        return {"acc": self.rows * self.d}

    def onchip_bytes(self, itemsize: int, direction: str) -> int:
        # No dots: registers hold the tile; a row reduction spills one float32 tile at most.
        return self.rows * self.d * 4


RMS_TILE_ELEMS = 8192  # elements a program touches per step: 32 float32 a thread at 8 warps


def rms_norm_blocks(n: int, d: int, device: Device, direction: str) -> RowBlocks:
    """GPU: as many rows as make ~8K elements (1-2 rows at D=4096, 32 at D=256),
    num_warps from the tile (16-32 elements a thread, 1..8 warps): Triton's layer-norm
    tutorial settings, with several rows when rows are short. Backward: 4 programs
    per SM, each looping over its share of row blocks."""
    if device.kind == "tpu":
        rows = fit_block(256, n, 8)
        return RowBlocks(rows=rows, d=d, programs=max(1, -(-n // rows)), target="tpu")
    rows = fit_block(max(1, RMS_TILE_ELEMS // d), n, 1)
    warps = min(8, max(1, rows * d // 512))
    nblocks = -(-n // rows)
    programs = min(nblocks, 4 * device.cores) if direction == "bwd" else nblocks
    cfg = RowBlocks(rows=rows, d=d, num_warps=warps, programs=programs)
    while not cfg.fits(device, 4, direction) and cfg.rows > 1:
        cfg = dataclasses.replace(cfg, rows=cfg.rows // 2)
    return cfg


# ----------------------------------------------------------------- token_logprobs

@dataclass(frozen=True)
class VocabBlocks(_Blocks):
    """`rows` x `vocab` tiles: forward walks the vocabulary (pipelined loads),
    backward writes one tile per program."""

    rows: int
    vocab: int
    num_warps: int = 4
    num_stages: int = 1
    target: str = "gpu"  # the chip these blocks are for: "gpu" (Triton) or "tpu" (Mosaic); see _common.lowering

    def tiles(self, direction: str) -> dict[str, int]:
        return {"acc": self.rows * self.vocab}

    def onchip_bytes(self, itemsize: int, direction: str) -> int:
        return self.num_stages * self.rows * self.vocab * itemsize + self.rows * self.vocab * 4


def token_logprobs_blocks(n: int, v: int, itemsize: int, device: Device, direction: str) -> VocabBlocks:
    """GPU forward: 8 rows x 2048 vocabulary, 8 warps (64 float32 a thread), 3 stages of
    loads in flight; 8 rows give N/8 programs (512 at N=4096: ~4 per SM) for a
    bandwidth-bound pass. Backward: 16 x 1024 tiles, one per program, 4 warps."""
    if device.kind == "tpu":
        return VocabBlocks(rows=fit_block(128, n, 8), vocab=fit_block(2048, v, 128), target="tpu")
    if direction == "fwd":
        cfg = VocabBlocks(rows=fit_block(8, n, 1), vocab=fit_block(dividing_block(2048, v, 128), v), num_warps=8,
                          num_stages=3)
    else:
        cfg = VocabBlocks(rows=fit_block(16, n, 1), vocab=fit_block(dividing_block(1024, v, 128), v), num_warps=4,
                          num_stages=1)
    while not cfg.fits(device, itemsize, direction):
        if cfg.num_stages > 1:
            cfg = dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.vocab > 128:
            cfg = dataclasses.replace(cfg, vocab=cfg.vocab // 2)
        else:
            raise ValueError(f"no token_logprobs blocks fit {device.name}")
    return cfg
