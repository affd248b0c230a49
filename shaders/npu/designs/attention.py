#!/usr/bin/env python3
# designs/attention.py - tandem NPU attention designs, kernel ABI v1.
#
# NOT RUN HERE: written against mlir-aie's IRON API (aie.iron) without the
# toolchain; see ../README.md "Not verified".
#
# Emits the MLIR of one design (decode or prefill, one head_dim and group) for
# one NPU generation. The same script also holds the work schedule in plain
# Python (plan_dispatch), which attention.cc reproduces on the cores.
#
#   python3 attention.py --generation npu4 --phase decode --head-dim 256 \
#       --group 4 --max-context 32768 --cache-dtype bf16 > attn.mlir
#
# Layout of the array use
# -----------------------
# decode: a *lane* is two adjacent columns cA = 2L, cB = 2L + 1 (npu1: 4
#   columns -> 2 lanes; npu4: 8 columns -> 4 lanes), with one compute tile
#   (cA, row 2). A work item is (row, kv group); the tile holds the G query
#   heads of the group.
#     shim cA MM2S: params (bo0, once per dispatch), q (bo1); S2MM: out (bo4)
#     shim cB MM2S: kv (bo2 then bo3, 128-key block by block)
#     memtile cB: buffers the kv chunks on their way to the tile.
# prefill: a lane is four columns c0..c3 = 4L..4L+3 (npu1: 1 lane, npu4: 2)
#   with 16 compute tiles (rows 2..5). A work item is (q-block of <= 32 rows,
#   kv group); tile `job` holds query head g*G + job // (16/G) and 2*G rows of
#   the q-block.
#     shim c0 MM2S ch: params; shim c1 MM2S: kv; shim ch MM2S: q for the four
#     tiles of column ch (split in memtile ch); S2MM: their out (joined in
#     memtile ch).
#     memtile c1 broadcasts each kv chunk to all 16 tiles, so K/V of a kv
#     group is read from DRAM once per work item.
#
# Params, and why the runtime sequence depends on the dispatch
# ------------------------------------------------------------
# The cores read params (bo0) through an ObjectFifo, once per dispatch, and
# derive everything (items, blocks, masks, scale) from it: the xclbin is
# dispatch-independent. The runtime sequence (insts.bin) cannot read bo0: NPU
# instruction streams are static lists of DMA descriptors. Which K/V rows to
# stream depends on positions, slots, kv_heads and capacity, so the runtime
# sequence is generated for one concrete dispatch (a "plan"). Without --plan
# this script emits the canonical plan described in ../CONTRACT.md; the
# instructions for any other dispatch must be generated the same way (same
# task order) by the host. This is the main open item of v1 (README).

import argparse
import json
import math
import struct
import sys

KV_BLOCK = 128
Q_BLOCK = 32
PREFILL_JOBS = 16
MAX_ROWS = {"decode": 64, "prefill": 256}
COLUMNS = {"npu1": 4, "npu4": 8}


# ---------------------------------------------------------------------------
# Geometry shared with attention.cc (keep in step with the constants there).
# ---------------------------------------------------------------------------
def nlanes_for(generation, phase):
    return COLUMNS[generation] // (2 if phase == "decode" else 4)


def geometry(phase, head_dim, group):
    if head_dim not in (128, 256):
        raise SystemExit("head_dim must be 128 or 256")
    if group not in (1, 2, 4, 8):
        raise SystemExit("group must be 1, 2, 4 or 8")
    if phase == "prefill":
        if head_dim == 256 and group == 8:
            raise SystemExit("prefill d256 g8 does not fit a compute tile")
        jobs = PREFILL_JOBS
        cph = jobs // group
        nv = Q_BLOCK // cph  # 2 * group
        ch = 1024 // head_dim
    else:
        jobs, cph, nv, ch = 1, 1, group, 2048 // head_dim
    return {
        "jobs": jobs,
        "cph": cph,
        "nv": nv,
        "ch": ch,
        "chunks": KV_BLOCK // ch,
        "max_rows": MAX_ROWS[phase],
        "params_words": 9 + 2 * MAX_ROWS[phase],
        "ctl_words": 144,
    }


# ---------------------------------------------------------------------------
# The v1 schedule, in plain Python (attention.cc: count_qblocks, qblock_rows,
# tandem_attn_plan, tandem_attn_item_begin).
# ---------------------------------------------------------------------------
def parse_params(words):
    w = list(words)
    p = {
        "abi": w[0],
        "rows": w[1],
        "heads": w[2],
        "kv_heads": w[3],
        "head_dim": w[4],
        "capacity": w[5],
        "window": w[6],
        "scale": struct.unpack("<f", struct.pack("<I", w[7]))[0],
        "slots": w[8],
    }
    p["position"] = [w[9 + 2 * r] for r in range(p["rows"])]
    p["slot"] = [w[10 + 2 * r] for r in range(p["rows"])]
    return p


def visible_lo(p, pos):
    if p["window"] == 0:
        return 0
    return pos + 1 - p["window"] if pos + 1 > p["window"] else 0


def qblocks(p, phase):
    if phase == "decode":
        return [(r, 1) for r in range(p["rows"])]
    out = []
    for r in range(p["rows"]):
        if not out or out[-1][1] == Q_BLOCK or p["slot"][r] != p["slot"][r - 1]:
            out.append([r, 0])
        out[-1][1] += 1
    return [tuple(b) for b in out]


def plan_dispatch(p, phase, head_dim, group, nlanes):
    """Per lane, the ordered work items: dict(row0, nrows, slot, g, blocks)."""
    geo = geometry(phase, head_dim, group)
    if p["abi"] != 1 or p["head_dim"] != head_dim:
        raise SystemExit("params do not match this design (abi/head_dim)")
    if p["heads"] != p["kv_heads"] * group:
        raise SystemExit("params do not match this design (group)")
    if p["rows"] > geo["max_rows"]:
        raise SystemExit(f"rows > {geo['max_rows']}: refused")
    if p["capacity"] % KV_BLOCK:
        raise SystemExit("capacity must be a multiple of 128 for these designs")
    lanes = [[] for _ in range(nlanes)]
    items = [(qb, g) for qb in qblocks(p, phase) for g in range(p["kv_heads"])]
    for i, ((row0, nrows), g) in enumerate(items):
        rows = range(row0, row0 + nrows)
        lo_min = min(visible_lo(p, p["position"][r]) for r in rows)
        p_max = max(p["position"][r] for r in rows)
        lanes[i % nlanes].append(
            {
                "row0": row0,
                "nrows": nrows,
                "slot": p["slot"][row0],
                "g": g,
                "blocks": list(range(lo_min // KV_BLOCK, p_max // KV_BLOCK + 1)),
            }
        )
    return lanes


def canonical_params(phase, head_dim, group, max_context, nlanes):
    """The dispatch the shipped insts.bin is generated for (CONTRACT.md)."""
    heads, kv_heads = group, 1
    if phase == "decode":
        rows = nlanes
        pos = [KV_BLOCK * (r + 1) - 1 for r in range(rows)]
        slot = list(range(rows))
        slots = rows
    else:
        rows = Q_BLOCK
        pos = list(range(rows))
        slot = [0] * rows
        slots = 1
    scale = struct.unpack("<I", struct.pack("<f", 1.0 / math.sqrt(head_dim)))[0]
    w = [1, rows, heads, kv_heads, head_dim, max_context, 0, scale, slots]
    for r in range(rows):
        w += [pos[r], slot[r]]
    return w


# ---------------------------------------------------------------------------
# IRON design
# ---------------------------------------------------------------------------
def design(args, words):
    import numpy as np
    from ml_dtypes import bfloat16

    from aie.dialects import arith
    from aie.extras import types as T
    from aie.helpers.taplib import TensorAccessPattern
    from aie.iron import Kernel, LocalBuffer, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from aie.iron.placers import SequentialPlacer

    phase, d, grp = args.phase, args.head_dim, args.group
    geo = geometry(phase, d, grp)
    nv, ch, chunks, jobs = geo["nv"], geo["ch"], geo["chunks"], geo["jobs"]
    nl = nlanes_for(args.generation, phase)
    dev = NPU1() if args.generation == "npu1" else NPU2()

    p = parse_params(words)
    plan = plan_dispatch(p, phase, d, grp, nl)
    heads, kvh = p["heads"], p["kv_heads"]
    cap, slots, rows = p["capacity"], p["slots"], p["rows"]
    if cap > args.max_context:
        raise SystemExit("capacity > --max-context")

    bf16 = np.dtype[bfloat16]
    u32, i32, f32 = np.dtype[np.uint32], np.dtype[np.int32], np.dtype[np.float32]
    params_ty = np.ndarray[(geo["params_words"],), u32]
    ctl_ty = np.ndarray[(geo["ctl_words"],), i32]
    stat_ty = np.ndarray[(4 * nv,), f32]
    scores_ty = np.ndarray[(nv * KV_BLOCK,), f32]
    acc_ty = np.ndarray[(nv * d,), f32]
    qt_ty = np.ndarray[(nv * d,), bf16]  # one tile's q (and out)
    chunk_ty = np.ndarray[(ch * d,), bf16]  # CH keys (or values)
    half_ty = np.ndarray[(4 * nv * d,), bf16]  # four tiles' q/out (prefill)

    # Runtime buffers (bo0..bo4). Sizes are those of the plan's dispatch.
    rt_params_ty = np.ndarray[(geo["params_words"],), u32]
    rt_q_ty = np.ndarray[(rows * heads * d,), bf16]
    rt_kv_ty = np.ndarray[(slots * cap * kvh * d,), bf16]

    obj = args.kernel_object
    k_plan = Kernel("tandem_attn_plan", obj, [params_ty, ctl_ty, np.int32, np.int32])
    k_item = Kernel("tandem_attn_item_begin", obj, [params_ty, ctl_ty, stat_ty, acc_ty, acc_ty])
    k_blk = Kernel("tandem_attn_block_begin", obj, [ctl_ty, scores_ty])
    k_score = Kernel("tandem_attn_score_chunk", obj, [qt_ty, chunk_ty, params_ty, ctl_ty, scores_ty])
    k_soft = Kernel("tandem_attn_softmax", obj, [ctl_ty, stat_ty, scores_ty, acc_ty])
    k_pv = Kernel("tandem_attn_pv_chunk", obj, [chunk_ty, ctl_ty, stat_ty, scores_ty, acc_ty])
    k_bend = Kernel("tandem_attn_block_end", obj, [ctl_ty, stat_ty, acc_ty, acc_ty])
    k_iend = Kernel("tandem_attn_item_end", obj, [ctl_ty, stat_ty, acc_ty, qt_ty])
    kernels = [k_plan, k_item, k_blk, k_score, k_soft, k_pv, k_bend, k_iend]

    def as_index(buf, i):
        # ctl[i] (i32, written by the C++ functions) as an scf loop bound.
        return arith.index_cast(T.index(), buf[i])

    def make_core(lane, job):
        def core_fn(of_params, of_q, of_kv, of_o, plan_k, item_k, blk_k, score_k,
                    soft_k, pv_k, bend_k, iend_k):
            ctl = LocalBuffer(type=ctl_ty, name=f"ctl_{lane}_{job}")
            stat = LocalBuffer(type=stat_ty, name=f"stat_{lane}_{job}")
            scores = LocalBuffer(type=scores_ty, name=f"scores_{lane}_{job}")
            acc = LocalBuffer(type=acc_ty, name=f"acc_{lane}_{job}")
            part = LocalBuffer(type=acc_ty, name=f"part_{lane}_{job}")
            for _ in range_(sys.maxsize):  # one iteration per dispatch
                prm = of_params.acquire(1)
                plan_k(prm, ctl, lane, job)
                for _ in range_(as_index(ctl, 0)):  # items of this tile
                    q = of_q.acquire(1)
                    item_k(prm, ctl, stat, acc, part)
                    for _ in range_(as_index(ctl, 1)):  # 128-key blocks
                        blk_k(ctl, scores)
                        for _ in range_(chunks):  # K chunks
                            kc = of_kv.acquire(1)
                            score_k(q, kc, prm, ctl, scores)
                            of_kv.release(1)
                        soft_k(ctl, stat, scores, acc)
                        for _ in range_(chunks):  # V chunks
                            vc = of_kv.acquire(1)
                            pv_k(vc, ctl, stat, scores, part)
                            of_kv.release(1)
                        bend_k(ctl, stat, acc, part)
                    o = of_o.acquire(1)
                    iend_k(ctl, stat, acc, o)
                    of_o.release(1)
                    of_q.release(1)
                of_params.release(1)

        return core_fn

    workers = []
    lane_fifos = []
    for L in range(nl):
        if phase == "decode":
            cols = [2 * L, 2 * L + 1]
        else:
            cols = [4 * L + i for i in range(4)]
        cA, cB = cols[0], cols[1]  # params/q/out column, kv column
        of_params = ObjectFifo(params_ty, depth=1, name=f"params{L}")
        of_kv = ObjectFifo(chunk_ty, depth=2, name=f"kv{L}")
        kv_mem = of_kv.cons().forward(placement=Tile(cB, 1), depth=4, name=f"kv{L}_mem")
        if phase == "decode":
            of_q = ObjectFifo(qt_ty, depth=2, name=f"q{L}")
            of_o = ObjectFifo(qt_ty, depth=2, name=f"o{L}")
            workers.append(
                Worker(
                    make_core(L, 0),
                    [of_params.cons(), of_q.cons(), kv_mem.cons(), of_o.prod()] + kernels,
                    placement=Tile(cA, 2),
                )
            )
            lane_fifos.append({"params": of_params, "kv": of_kv, "q": [of_q],
                               "o": [of_o], "cols": cols})
        else:
            qs, os_ = [], []
            q_tiles, o_tiles = [], []
            for half, col in enumerate(cols):
                of_q = ObjectFifo(half_ty, depth=2, name=f"q{L}_{half}")
                q_split = of_q.cons().split(
                    offsets=[nv * d * i for i in range(4)],
                    obj_types=[qt_ty] * 4,
                    names=[f"q{L}_{half}_{i}" for i in range(4)],
                    depths=[2] * 4,
                    placement=Tile(col, 1),
                )
                of_o = ObjectFifo(half_ty, depth=2, name=f"o{L}_{half}")
                o_join = of_o.prod().join(
                    offsets=[nv * d * i for i in range(4)],
                    obj_types=[qt_ty] * 4,
                    names=[f"o{L}_{half}_{i}" for i in range(4)],
                    depths=[2] * 4,
                    placement=Tile(col, 1),
                )
                qs.append(of_q)
                os_.append(of_o)
                q_tiles += list(q_split)
                o_tiles += list(o_join)
            for job in range(jobs):
                col = cols[job // 4]
                workers.append(
                    Worker(
                        make_core(L, job),
                        [of_params.cons(), q_tiles[job].cons(), kv_mem.cons(),
                         o_tiles[job].prod()] + kernels,
                        placement=Tile(col, 2 + job % 4),
                    )
                )
            lane_fifos.append({"params": of_params, "kv": of_kv, "q": qs, "o": os_,
                               "cols": cols})

    # ---- runtime sequence for the plan --------------------------------------
    rowstride = heads * d  # elements between query rows in q / out
    kvrow = kvh * d  # elements between cache rows in k / v

    def q_runs(item, job):
        """(offset, sizes, strides) runs feeding tile `job` of a prefill item:
        rows past the q-block repeat its last row (stride-0 repeat dim)."""
        head = item["g"] * grp + job // geo["cph"]
        first = (job % geo["cph"]) * nv
        want = [min(first + v, item["nrows"] - 1) for v in range(nv)]
        nvalid = sum(1 for v in range(nv) if first + v <= item["nrows"] - 1)
        runs = []
        if nvalid:
            off = ((item["row0"] + want[0]) * heads + head) * d
            runs.append((off, [1, 1, nvalid, d], [0, 0, rowstride, 1]))
        if nvalid < nv:
            off = ((item["row0"] + item["nrows"] - 1) * heads + head) * d
            runs.append((off, [nv - nvalid, 1, 1, d], [0, 0, 0, 1]))
        return runs

    def kv_block_tap(item, b, dims):
        row = (b * KV_BLOCK) % cap  # capacity % 128 == 0: no wrap inside
        off = ((item["slot"] * cap + row) * kvh + item["g"]) * d
        return TensorAccessPattern(dims, off, [1, 1, KV_BLOCK, d], [0, 0, kvrow, 1])

    rt = Runtime()
    with rt.sequence(rt_params_ty, rt_q_ty, rt_kv_ty, rt_kv_ty, rt_q_ty) as (
        b_params, b_q, b_k, b_v, b_out
    ):
        rt.start(*workers)
        qdims = [rows * heads * d]
        kvdims = [slots * cap * kvh * d]
        # params: once per dispatch, to every lane.
        tg = rt.task_group()
        for L in range(nl):
            rt.fill(lane_fifos[L]["params"].prod(), b_params, task_group=tg,
                    wait=True, placement=Tile(lane_fifos[L]["cols"][0], 0))
        rt.finish_task_group(tg)
        nrounds = max(len(items) for items in plan)
        for t in range(nrounds):
            active = [L for L in range(nl) if t < len(plan[L])]
            # q tiles of this round's items
            tg = rt.task_group()
            for L in active:
                it = plan[L][t]
                if phase == "decode":
                    off = (it["row0"] * heads + it["g"] * grp) * d
                    rt.fill(lane_fifos[L]["q"][0].prod(), b_q,
                            tap=TensorAccessPattern(qdims, off, [1, 1, grp, d], [0, 0, d, 1]),
                            task_group=tg, wait=True,
                            placement=Tile(lane_fifos[L]["cols"][0], 0))
                else:
                    for half in range(4):
                        for job in range(4 * half, 4 * half + 4):
                            for off, sz, st in q_runs(it, job):
                                rt.fill(lane_fifos[L]["q"][half].prod(), b_q,
                                        tap=TensorAccessPattern(qdims, off, sz, st),
                                        task_group=tg, wait=True,
                                        placement=Tile(lane_fifos[L]["cols"][half], 0))
            rt.finish_task_group(tg)
            # K then V, block by block, ascending; one block of look-ahead.
            nb = max(len(plan[L][t]["blocks"]) for L in active)
            prev = None
            for bi in range(nb):
                tg = rt.task_group()
                for L in active:
                    it = plan[L][t]
                    if bi >= len(it["blocks"]):
                        continue
                    b = it["blocks"][bi]
                    for buf in (b_k, b_v):
                        rt.fill(lane_fifos[L]["kv"].prod(), buf,
                                tap=kv_block_tap(it, b, kvdims), task_group=tg,
                                wait=True,
                                placement=Tile(lane_fifos[L]["cols"][1], 0))
                if prev is not None:
                    rt.finish_task_group(prev)
                prev = tg
            if prev is not None:
                rt.finish_task_group(prev)
            # out tiles (same runs as q; padded rows rewrite the last row with
            # identical values)
            tg = rt.task_group()
            for L in active:
                it = plan[L][t]
                if phase == "decode":
                    off = (it["row0"] * heads + it["g"] * grp) * d
                    rt.drain(lane_fifos[L]["o"][0].cons(), b_out,
                             tap=TensorAccessPattern(qdims, off, [1, 1, grp, d], [0, 0, d, 1]),
                             task_group=tg, wait=True,
                             placement=Tile(lane_fifos[L]["cols"][0], 0))
                else:
                    for half in range(4):
                        for job in range(4 * half, 4 * half + 4):
                            for off, sz, st in q_runs(it, job):
                                rt.drain(lane_fifos[L]["o"][half].cons(), b_out,
                                         tap=TensorAccessPattern(qdims, off, sz, st),
                                         task_group=tg, wait=True,
                                         placement=Tile(lane_fifos[L]["cols"][half], 0))
            rt.finish_task_group(tg)

    return Program(dev, rt).resolve_program(SequentialPlacer())


def main():
    ap = argparse.ArgumentParser(description="tandem NPU attention design (ABI v1)")
    ap.add_argument("--generation", choices=["npu1", "npu4"], required=True)
    ap.add_argument("--phase", choices=["decode", "prefill"], required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--group", type=int, required=True)
    ap.add_argument("--max-context", type=int, default=32768)
    ap.add_argument("--cache-dtype", choices=["bf16"], default="bf16")
    ap.add_argument("--kernel-object", default="attention.o",
                    help="object file of kernels/attention.cc for this shape")
    ap.add_argument("--plan", help="JSON list of params u32 words of one dispatch; "
                    "default: the canonical plan (CONTRACT.md)")
    ap.add_argument("--print-config", action="store_true",
                    help="print the -D flags for attention.cc and exit")
    ap.add_argument("-o", "--output", help="write MLIR here instead of stdout")
    args = ap.parse_args()

    geo = geometry(args.phase, args.head_dim, args.group)
    nlanes = nlanes_for(args.generation, args.phase)
    if args.max_context % KV_BLOCK:
        raise SystemExit("--max-context must be a multiple of 128")
    if args.print_config:
        print(" ".join([
            f"-DTANDEM_HEAD_DIM={args.head_dim}",
            f"-DTANDEM_GROUP={args.group}",
            f"-DTANDEM_PREFILL={1 if args.phase == 'prefill' else 0}",
            f"-DTANDEM_NLANES={nlanes}",
            f"-DTANDEM_MAX_ROWS={geo['max_rows']}",
        ]))
        return
    if args.plan:
        with open(args.plan) as f:
            words = json.load(f)
        words = words + [0] * (geo["params_words"] - len(words))
    else:
        words = canonical_params(args.phase, args.head_dim, args.group,
                                 args.max_context, nlanes)
    module = design(args, words)
    text = str(module)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
