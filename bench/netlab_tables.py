#!/usr/bin/python3
"""bench/netlab's tables, from the raw values it wrote to OUT:

  links.tsv  rate host one_way_mbit bidir_up_mbit bidir_down_mbit
  speed.tsv  rate row round steps_s step_ms compute_ms comm_ms cpu_ms ps_cpu_ms allreduce_ms all_cpu_ms
  tta.tsv    rate row round seconds step accuracy reached

("-" where a value is missing.) Markdown tables on stdout; run it again on
an OUT directory to reprint them:
    /usr/bin/python3 bench/netlab_tables.py --out DIR --rates 1gbit,10gbit --rows sync,beside,async,ddp,tfps \\
        --params 669706 --row-info "sync:sync:4 async:async:4"
"""
import argparse
import os
import statistics
import sys


def num(s):
    try:
        return float(s)
    except ValueError:
        return None


def read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, nd=1):
    return "-" if v is None else "%.*f" % (nd, v)


def rate_mbit(rate):
    """Mbit/s of a tc rate (1gbit, 500mbit; a delay after + as in
    1gbit+250us, or a queue after / as in 1gbit/q262144, is not part of
    it); None for 0 or another form."""
    rate = rate.split("+")[0].split("/")[0]
    for suf, f in (("gbit", 1000.0), ("mbit", 1.0), ("kbit", 0.001)):
        if rate.endswith(suf) and num(rate[:-len(suf)]):
            return num(rate[:-len(suf)]) * f
    return None


def label(row):
    return {"ddp": "DDP (gloo)", "ddp-debian": "DDP (gloo, Debian's torch)",
            "tfps": "TF PS"}.get(row, "pstrain " + row)


def links_table(links, rates):
    """Prints the links as iperf3 measured them; returns {rate: Mbit/s per
    direction, both ways at once, the slowest host}."""
    floor_rate = {}   # rate -> Mbit/s per direction, both ways at once, slowest host
    if links:
        print("\n### Links as measured (iperf3 TCP, Mbit/s, from each host to the iperf3 peer)\n")
        print("| shaped to | " + " | ".join("host %s one way / both ways" % h for h in sorted({l[1] for l in links})) + " |")
        print("|---|" + "---|" * len({l[1] for l in links}))
        for rate in rates:
            ls = [l for l in links if l[0] == rate]
            cells = ["%s / %s+%s" % (l[2], l[3], l[4]) for l in sorted(ls, key=lambda l: l[1])]
            print("| %s | %s |" % (rate, " | ".join(cells)))
            bi = [((num(l[3]) or 0) + (num(l[4]) or 0)) / 2 for l in ls if num(l[3]) and num(l[4])]
            if bi:
                floor_rate[rate] = min(bi)
        print("\nBoth ways: what the host sent + what it received at the same time (`iperf3 --bidir`).")
        for rate in rates:
            nominal = rate_mbit(rate)
            got = [num(l[2]) for l in links if l[0] == rate and num(l[2])]
            if nominal and got and max(got) < 0.8 * nominal:
                print("**The shaping does not sustain %s here**: one way reached at most %.0f Mbit/s "
                      "(%.0f%%); at this rate the hosts' CPUs (the veth and TCP work of both ends "
                      "shares the machine's cores), not the shaper, set the link's speed." % (
                          rate, max(got), 100 * max(got) / nominal))
    return floor_rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rates", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--params", type=int, default=0)
    ap.add_argument("--row-info", default="",
                    help="ROW:MODE:PUSH:PULL ... for the pstrain rows (bytes per parameter each way)")
    ap.add_argument("--target", default="88")
    ap.add_argument("--eval-every", default="-")
    a = ap.parse_args()
    rates, rows = a.rates.split(","), a.rows.split(",")
    info = {}
    for t in a.row_info.split():
        f = t.split(":")
        info[f[0]] = (f[1], int(f[2]), int(f[3] if len(f) > 3 else f[2]))

    links = read(os.path.join(a.out, "links.tsv"))
    speed = read(os.path.join(a.out, "speed.tsv"))
    tta = read(os.path.join(a.out, "tta.tsv"))

    floor_rate = links_table(links, rates)

    # ---- steps/s
    if speed:
        sps = {}
        for r in speed:
            sps.setdefault((r[0], r[1]), []).append(num(r[3]))
        print("\n### Steps/s (median of rounds; each round's value in parentheses)\n")
        print("| row | " + " | ".join("%s link" % r for r in rates) + " |")
        print("|---|" + "---|" * len(rates))
        meds = {}
        for row in rows:
            cells = []
            for rate in rates:
                vs = sps.get((rate, row), [])
                m = med(vs)
                meds[(rate, row)] = m
                cells.append("**%s** (%s)" % (fmt(m), ", ".join(fmt(v) for v in vs)) if vs else "-")
            print("| %s | %s |" % (label(row), " | ".join(cells)))
        if "ddp" in rows:
            for row in rows:
                if row == "ddp":
                    continue
                cells = []
                for rate in rates:
                    p, d = meds.get((rate, row)), meds.get((rate, "ddp"))
                    cells.append("**%.2fx**" % (p / d) if p and d else "-")
                print("| %s / DDP | %s |" % (label(row), " | ".join(cells)))
        if "tfps" in rows:
            for row in rows:
                if row in ("ddp", "ddp-debian", "tfps"):
                    continue
                cells = []
                for rate in rates:
                    p, t = meds.get((rate, row)), meds.get((rate, "tfps"))
                    cells.append("**%.2fx**" % (p / t) if p and t else "-")
                print("| %s / TF PS | %s |" % (label(row), " | ".join(cells)))
        print("\nA step: every worker (rank) trains one batch of its own; pstrain async: the chief's "
              "steps (each worker steps on its own); TF PS: 2 batches of 128 trained by whichever "
              "workers were free, each applied on its own (samples/s / 256).")

        # ---- where the time goes
        print("\n### Where a step's time goes (medians, ms per step)\n")
        ncpu = len(os.sched_getaffinity(0))
        print("| row | link | step | compute | communication | worker CPU | ps CPU (each) "
              "| not on a CPU (step - worker CPU) | allreduce alone | CPU, all processes "
              "| CPU ceiling, %d CPUs: steps/s |" % ncpu)
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            for rate in rates:
                rs = [r for r in speed if r[0] == rate and r[1] == row]
                if not rs:
                    continue
                col = [med([num(r[i]) if i < len(r) else None for r in rs]) for i in range(4, 11)]
                step, comp, comm, cpu, pscpu, ar, allcpu = col
                wait = None if step is None or cpu is None else max(0.0, step - cpu)
                print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    label(row), rate, fmt(step, 2), fmt(comp, 2), fmt(comm, 2), fmt(cpu, 2),
                    fmt(pscpu, 2), fmt(wait, 2), fmt(ar, 2), fmt(allcpu, 2),
                    fmt(ncpu * 1e3 / allcpu) if allcpu else "-"))
        print("""
- pstrain: compute and communication come from the chief's `worker 0: per step:`
  line at its exit ("-": this pstrain does not print one); worker CPU is the
  chief's process CPU time (user + system, all threads: compute, sealing and
  opening frames, copies, the kernel's TCP work) over the window, per step;
  ps CPU the same for each ps (summing the gradients, the optimizer, crypto,
  copies). Step minus worker CPU is time the chief spent waiting: for the
  wire, for the ps, or for a CPU (more processes than cores).
- DDP: compute is the same step under `no_sync()` (forward, backward,
  optimizer step; timed in chunks alternating with the DDP steps),
  communication = step - compute; worker CPU is rank 0's process CPU time
  per step (torch's and gloo's threads); allreduce alone: one plain
  `all_reduce` of the P parameters, as DDP's single bucket.
- TF PS: step = the coordinator's wall time between two `coordinator.join()`s
  over the steps; no compute/communication split; worker CPU is worker 0's
  process CPU per step (each worker trains about one batch per step), ps CPU
  each ps's (reading and sending the parameters, receiving the gradients,
  the momentum update), all processes including the coordinator's.
- CPU, all processes: the CPU time per step of every process of the row
  (pstrain: 2 workers + 2 ps; DDP: 2 ranks; TF PS: 2 workers + 2 ps + the
  coordinator), and the most steps/s this
  machine's CPUs could give it if nothing else ran and the work spread
  perfectly: a bound that does not depend on other jobs' load.""")

        # ---- the link floor
        if a.params and floor_rate:
            print("\n### Against the full-duplex link floor\n")
            print("Every link carries the same bytes per step: a worker sends P*u bytes (its "
                  "gradient) and receives P*d (the parameters); each of the 2 ps receives P/2*u*2 = "
                  "P*u and sends P*d; a DDP rank's ring allreduce of 2 ranks sends and receives P*4; a TF PS "
                  "worker pulls P*4 and pushes P*4 per batch, about one batch per step. "
                  "P = %d; u, d = 4 bytes, 2 where wire_dtype makes that direction bfloat16. Link "
                  "rate: the slowest host's mean per-direction rate with both directions at once "
                  "(iperf3 --bidir).\n" % a.params)
            print("| row | link | rate per direction | bytes per step up, down | floor ms/step "
                  "(both ways at once) | max steps/s | push then pull: ms/step, max steps/s | "
                  "steps/s | of the full-duplex max | of the push-then-pull max |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for row in rows:
                m, up, down = info.get(row, ("sync", 4, 4))
                if row not in ("ddp", "ddp-debian") and m != "sync":
                    continue
                for rate in rates:
                    if rate not in floor_rate:
                        continue
                    mbit = floor_rate[rate]
                    bit_ms = mbit * 1e3   # bits per ms
                    ms = a.params * max(up, down) * 8 / bit_ms
                    seq = a.params * (up + down) * 8 / bit_ms
                    got = med(sps.get((rate, row), []))
                    print("| %s | %s | %.0f Mbit/s | %.2f, %.2f MB | %.2f | %.1f | %.2f, %.1f | %s | %s | %s |" % (
                        label(row), rate, mbit, a.params * up / 1e6, a.params * down / 1e6, ms, 1e3 / ms,
                        seq, 1e3 / seq, fmt(got),
                        "**%.0f%%**" % (100 * got * ms / 1e3) if got else "-",
                        "%.0f%%" % (100 * got * seq / 1e3) if got else "-"))
            print("\nPush then pull: the floor when a worker's link carries one direction at a time "
                  "(the whole gradient up, then the whole parameter vector down).")

    # ---- time to accuracy
    if tta:
        print("\n### Wall time to %s%% test accuracy (s; median of rounds, each run in parentheses)\n" % a.target)
        print("| row | " + " | ".join("%s link" % r for r in rates) + " |")
        print("|---|" + "---|" * len(rates))
        for row in rows:
            cells = []
            for rate in rates:
                rs = [r for r in tta if r[0] == rate and r[1] == row]
                if not rs:
                    cells.append("-")
                    continue
                got = [num(r[3]) for r in rs if r[6] == "1"]
                runs = ", ".join("%s s at step %s" % (r[3], r[4]) if r[6] == "1"
                                 else "not reached, last %s%%" % r[5] for r in rs)
                m = med(got) if len(got) == len(rs) else None
                cells.append("**%s** (%s)" % (fmt(m), runs))
            print("| %s | %s |" % (label(row), " | ".join(cells)))
        print("\nFrom launching the processes (data loading and connecting included) to the first "
              "evaluation at or above the target; the chief (rank 0; TF PS: the coordinator, the workers "
              "idle meanwhile) evaluates the full test set every %s steps, inside the clock. The median needs every run of a "
              "cell to reach the target." % a.eval_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
