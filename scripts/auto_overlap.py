"""What `auto` measures on a task's train split (the trainers' prompt pool, so the heads' training prompts) against
its tune split (what it measures on now): per method, the acceptance curve a[1..4] and the
shape each example set would choose. A thin caller of experiments/autoshape.py.

    python scripts/auto_overlap.py --task mt_bench --methods medusa:nodes=auto,bpd:heads=auto
"""
from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="mt_bench")
    ap.add_argument("--methods", default="medusa:nodes=auto,bpd:heads=auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from bpdbench.config import RunConfig
    from bpdbench.experiments import autoshape, session
    from bpdbench.experiments.examples import select_examples
    from bpdbench.experiments.plan import prepare
    from bpdbench.methods import parse_list

    run = RunConfig(task=a.task, model="qwen2.5-coder-0.5b", dtype=a.dtype, max_new_tokens=a.max_new_tokens,
                    limit=autoshape.N_EXAMPLES, heads_profile="quick", threads=a.threads)
    methods = parse_list(a.methods)
    s = session.open_session(prepare(run, "replay", methods, log=print), print)
    new, source = autoshape.heldout(s)
    held = [(ex, s.prompt(ex)) for ex in select_examples(run.replace(offset=0, limit=len(new)), "train")]
    cost = autoshape.cost_model(s)
    for m in methods:
        for name, examples in (("train split", held), (source["source"], new)):
            runs = [(fixed, autoshape.measure(s, pm, examples, {})) for pm, fixed in autoshape._plans(s, m)]
            accept = [round(x, 3) for x in runs[0][1].accept[:4]]
            print(f"{a.task} {m.label} | {name} | a[1..4] = {accept} | "
                  f"{autoshape.choose(m, runs, cost).describe(m.label)}")


if __name__ == "__main__":
    main()
