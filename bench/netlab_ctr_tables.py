#!/usr/bin/python3
"""bench/netlab_ctr's tables, from the raw values it wrote to OUT:

  links.tsv  rate host one_way_mbit bidir_up_mbit bidir_down_mbit
  speed.tsv  rate row round steps_s wire_bytes_per_step ps_rss_mib worker_rss_mib cpu_ms_per_step shard_mib
  tta.tsv    rate row round seconds step auc reached
  final.txt  "AUC WALL" of the one-epoch pstrain run

and PREP/meta.json (bench/ctr_prep.py: unique rows per batch, the logistic
regression's AUC). Markdown on stdout; run it again on an OUT to reprint:
    /usr/bin/python3 bench/netlab_ctr_tables.py --out DIR --rates 1gbit,10gbit \\
        --rows beside,apart,tfps,tfps-beside,ddp-sparse,ddp --tta-rows beside,apart,tfps,tfps-beside,ddp-sparse \\
        --prep build/ctrdata/prep-400000 --dim 16 --params 63361 --target 0.745 --cap 800
"""
import argparse
import json
import os
import re

from netlab_tables import fmt, links_table, med, num, read

LABEL = {"beside": "pstrain, ps beside workers", "apart": "pstrain, ps apart",
         "beside-bf16": "pstrain, ps beside, wire_dtype bf16", "apart-bf16": "pstrain, ps apart, wire_dtype bf16",
         "tfps": "TF PS, ps apart", "tfps-beside": "TF PS, ps beside workers",
         "ddp-sparse": "DDP, sparse gradients", "ddp": "DDP, dense gradients"}
WORKERS = 2


def label(row):
    """A row's name in the tables; a --variant's is its own."""
    return LABEL.get(row, "pstrain, variant " + row)


def final_line(out):
    """AUC WALL PS_PEAK_MIB SHARD_MIB of the one-epoch run, or []."""
    p = os.path.join(out, "final.txt")
    return open(p).read().split() if os.path.exists(p) else []


def cells(vals, nd):
    vs = [v for v in vals if v is not None]
    return "%s (%s)" % (fmt(med(vs), nd), ", ".join(fmt(v, nd) for v in vals)) if vs else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rates", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--tta-rows", default="")
    ap.add_argument("--prep", required=True)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--params", type=int, default=0, help="the dense layers' parameters")
    ap.add_argument("--target", default="0.745")
    ap.add_argument("--cap", default="-")
    a = ap.parse_args()
    rates, rows = a.rates.split(","), [r for r in a.rows.split(",") if r]
    tta_rows = [r for r in a.tta_rows.split(",") if r]
    meta = json.load(open(os.path.join(a.prep, "meta.json")))
    speed = read(os.path.join(a.out, "speed.tsv"))
    tta = read(os.path.join(a.out, "tta.tsv"))
    links_table(read(os.path.join(a.out, "links.tsv")), rates)

    u = meta["unique_rows_per_batch"]
    rows_bytes = WORKERS * u * a.dim * 4 * 2
    dense_bytes = WORKERS * a.params * 4 * 2
    col = lambda r, k: [num(x[k]) for x in speed if x[0] == r[0] and x[1] == r[1]]

    sps = {(rate, row): col((rate, row), 3) for rate in rates for row in rows}
    if speed:
        print("\n### Steps/s (median of rounds; each round's in parentheses) and pstrain beside's ratio to each\n")
        print("| row | " + " | ".join("%s: steps/s | beside / row" % r for r in rates) + " |")
        print("|---|" + "---|---|" * len(rates))
        for row in rows:
            cs = []
            for rate in rates:
                m, b = med(sps[rate, row]), med(sps.get((rate, "beside"), []))
                cs += [cells(sps[rate, row], 2), "%.1fx" % (b / m) if m and b else "-"]
            print("| %s | %s |" % (label(row), " | ".join(cs)))
        print("\nA step: 2 workers' batches of %d (TF: 2 functions; DDP: one batch a rank)." % meta["batch"])

        print("\n### Bytes on the wire per step (median), against the unique rows' bytes\n")
        print("Unique rows' bytes per step: %d workers x %.0f unique rows a batch (of %d IDs) x %d floats x 4 bytes "
              "x 2 ways = %.0f KB; with the dense layers' %d parameters and gradients (x %d workers) %.0f KB.\n" % (
                  WORKERS, u, meta["ids_per_batch"], a.dim, rows_bytes / 1e3, a.params, WORKERS,
                  (rows_bytes + dense_bytes) / 1e3))
        print("| row | " + " | ".join("%s: KB/step | / rows' | / rows' + dense" % r for r in rates) + " |")
        print("|---|" + "---|---|---|" * len(rates))
        for row in rows:
            cs = []
            for rate in rates:
                m = med(col((rate, row), 4))
                cs += [fmt(m / 1e3 if m else None, 0), "%.2fx" % (m / rows_bytes) if m else "-",
                       "%.2fx" % (m / (rows_bytes + dense_bytes)) if m else "-"]
            print("| %s | %s |" % (label(row), " | ".join(cs)))
        print("\nWhat every host sent on its link in the window (frames, headers included), over its steps. "
              "Beside, each worker's traffic with its own ps never reaches the wire.")

        print("\n### Memory: resident MiB at the window's end (largest of the two), all rates and rounds\n")
        print("| row | ps RSS | shard (ps's own figure) | RSS / shard | worker or rank RSS | CPU ms per step, all processes |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            rs = [x for x in speed if x[1] == row]
            ps, sh, wk, cpu = (med([num(x[k]) for x in rs]) for k in (5, 8, 6, 7))
            ratio = "%.2f" % (ps / sh) if ps and sh else "-"
            print("| %s | %s | %s | %s | %s | %s |" % (label(row), fmt(ps, 0), fmt(sh, 0), ratio, fmt(wk, 0),
                                                      fmt(cpu, 1)))
        print("\npstrain's ps run under [ps] memory_limit = %s MiB: the tables and Adagrad's state (%.0f MiB) "
              "exceed it, each ps's half fits." % (a.cap, meta["rows"] * meta["fields"] * a.dim * 8 / 2 ** 20))
        f = final_line(a.out)
        if len(f) >= 4 and num(f[2]) and num(f[3]):
            print("In the one-epoch run each ps peaked at %s MiB resident (VmHWM) for a shard of %s MiB: %.2f of it." % (
                f[2], f[3], num(f[2]) / num(f[3])))

    if tta:
        print("\n### Time to test AUC %s (seconds from launch; step; median of rounds)\n" % a.target)
        print("| row | " + " | ".join("%s link" % r for r in rates) + " |")
        print("|---|" + "---|" * len(rates))
        hit = {}
        for row in tta_rows + [r for r in rows if r not in tta_rows]:
            cs = []
            for rate in rates:
                rs = [x for x in tta if x[0] == rate and x[1] == row]
                ok = [x for x in rs if x[6] == "1"]
                if ok:
                    s, st = med([num(x[3]) for x in ok]), med([num(x[4]) for x in ok])
                    hit[rate, row] = (s, st)
                    cs.append("%s s (step %s)%s" % (fmt(s, 1), fmt(st, 0),
                                                    "" if len(ok) == len(rs) else ", %d of %d reached" % (len(ok), len(rs))))
                elif rs:
                    cs.append("not reached (last AUC %s)" % rs[-1][5])
                elif row == "ddp" and med(sps.get((rate, row), [])) and (rate, "ddp-sparse") in hit:
                    st = hit[rate, "ddp-sparse"][1]
                    cs.append("not run: >= %.0f s (ddp-sparse's %d steps at %s steps/s)" % (
                        st / med(sps[rate, row]), st, fmt(med(sps[rate, row]), 3)))
                else:
                    cs.append("-")
            print("| %s | %s |" % (label(row), " | ".join(cs)))

    print("\n### Test AUC\n")
    print("| model | test AUC |")
    print("|---|---|")
    synth = os.path.join(os.path.dirname(os.path.abspath(a.prep)), "synth.txt")
    if os.path.exists(synth):
        m = re.search(r"planted model on the test rows: logloss [0-9.]+, AUC ([0-9.]+)", open(synth).read())
        if m:
            print("| the planted model (synth's ceiling) | %s |" % m.group(1))
    f = final_line(a.out)
    if f:
        print("| pstrain beside, one epoch (%s steps) | **%s** (wall %s s) |" % (
            meta["train"] // (WORKERS * meta["batch"]), f[0], f[1] if len(f) > 1 else "-"))
    if "lr_auc" in meta:
        print("| logistic regression on the same hashed IDs (bench/ctr_prep.py, numpy, one epoch) | %.4f |" % meta["lr_auc"])


if __name__ == "__main__":
    main()
