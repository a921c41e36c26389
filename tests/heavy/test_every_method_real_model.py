"""Every registered method on the real default model: replay equals real decoding (heavy: it builds the `ci`
draft networks and n-grams on first use, minutes of CPU)."""
from __future__ import annotations

from bpdbench import models
from bpdbench.experiments.plan import prepare
from bpdbench.methods.contract import feedback_k, needs_scorer, reads_reference
from tests.slow.test_real_model import fp32_model  # noqa: F401  (fixture)


def test_replay_equals_real_decoding_for_every_method_on_the_real_model(fp32_model, tmp_path, monkeypatch):
    """Every registered method that runs in our loop, on the real default model in float32 with the `ci` heads:
    replay (one teacher-forced forward, the loop's own propose/decide) and real decoding give identical counters.
    Neural rescorers that are not trained here get random weights in a private folder (cost and correctness of
    the path do not depend on the weights); n-grams are built on first use as in any run, and so are the `ci`
    drafters (EAGLE, EAGLE-3, Hydra, Hydra++, Amphista, KOALA: about a minute each on the cached `ci` data)."""
    from bpdbench import paths
    from bpdbench.config import RunConfig
    from bpdbench.engine import TreeScorer, generate, layers_of, replay, teacher_forced, teacher_forced_layers
    from bpdbench.experiments.session import open_session
    from bpdbench.methods import REGISTRY, parse
    from bpdbench.nets.small_lm import SmallLM, make_config, save_lm

    real_dir = paths.rescorer_dir
    monkeypatch.setattr(paths, "rescorer_dir", lambda tag, model: tmp_path / tag if tag.startswith("neural")
                        else real_dir(tag, model))
    cfg = RunConfig(task="xsum", limit=2, max_new_tokens=12, dtype="float32", heads_profile="ci", heads=4, k=8,
                    alpha_file=str(tmp_path / "alpha.json"), max_prompt_tokens=192)   # prefill is most of the cost
    s = open_session(prepare(cfg, "replay"), log=print)
    heads, _ = s.env.heads()
    for size in "sml":
        save_lm(SmallLM(make_config(size, len(heads.shortlist)), heads.shortlist).eval(), tmp_path / f"neural-{size}")
    spellings = [{"hf-lm": f"hf-lm:model={models.DEFAULT_MODEL},heads=2", "oracle": "oracle:k=8",
                  "sps": f"sps:model={models.DEFAULT_MODEL},gamma=3,schedule=heuristic",
                  "hierarchy": "hierarchy:history=ci"}.get(n, n)
                 for n, spec in REGISTRY.items() if not spec.external] + [
        "medusa:tree=auto", "bpd:threshold=0.2", f"cascade:top=sps,model={models.DEFAULT_MODEL},split=3,vertical=1",
        "hierarchy:order=lc,candidates=4,length=4"]
    prompts = [s.prompt(ex) for ex in s.examples]
    greedy = [s.reference.get(prompt, s.limits)[0] for prompt in prompts]
    hidden = [teacher_forced(s.model, p, g, with_prompt=True) for p, g in zip(prompts, greedy)]  # the prompt too
    for spelling in spellings:
        drafter = s.drafter(parse(spelling))
        # a drafter that learns from verify forwards (recycling keeps its matrix across examples) replays as its
        # own instance, with a scorer for the off-path nodes; one that drafts on the base's KV cache (qdraft and
        # layerskip with cache=base, the hybrid's default model source) replays with a scorer that rebuilds it
        learns = feedback_k(drafter)
        twin = s.env.build(parse(spelling)) if learns else drafter
        scorer = TreeScorer(s.model) if needs_scorer(drafter) else None
        for prompt, ref, h in zip(prompts, greedy, hidden):
            if reads_reference(drafter):
                drafter.use_reference(ref)
            real = generate(s.model, drafter, prompt, s.limits)
            assert real.tokens == ref, spelling
            layers = layers_of(twin)            # a drafter that reads chosen layers (eagle3) replays with them
            states = None if layers is None else \
                teacher_forced_layers(s.model, prompt, ref, layers.indices, with_prompt=True)[1]
            sim = replay(twin, prompt, ref, h, s.limits, scorer=scorer, layer_states=states)
            assert sim.to_dict() == real.counters.to_dict(), spelling
