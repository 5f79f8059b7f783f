"""The self-evolving curriculum (WebRL): inputs the elite solve sometimes are drawn first, and
the train split moves up a level of generator difficulty once a phase is accurate enough; the
level is archived and a resumed run trains where the run left off."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from evoagent import runner
from evoagent.archive import Archive
from evoagent.evolve.loop import Search
from evoagent.llm.scripted import ScriptedBackend
from evoagent.rl.config import CurriculumConfig
from evoagent.rl.curriculum import LEVEL_KEY, draw_inputs, next_level
from evoagent.tasks.datasets import Example

ROOT = Path(__file__).resolve().parents[2]


def test_inputs_solved_sometimes_are_drawn_first():
    train = [Example(k, k, "1") for k in ("sometimes", "always", "never", "unseen")]
    rates = {"sometimes": 0.5, "always": 1.0, "never": 0.0}
    cfg = CurriculumConfig(enabled=True, focus=4.0)
    firsts = [draw_inputs(train, 1, rates, cfg, random.Random(s))[0].id for s in range(400)]
    share = {k: firsts.count(k) / 400 for k in rates | {"unseen": 0}}
    assert share["sometimes"] > 0.6 and share["unseen"] > share["always"] + share["never"]
    assert sorted(e.id for e in draw_inputs(train, 4, rates, cfg, random.Random(0))) == sorted(rates | {"unseen": 0})


def test_a_level_is_climbed_once_accuracy_reaches_the_bar():
    cfg = CurriculumConfig(levels=({"max_digits": 2}, {"max_digits": 3}), promote_at=0.5)
    assert next_level(0, 0.4, cfg) == 0 and next_level(0, 0.5, cfg) == 1 and next_level(2, 1.0, cfg) == 2


def test_the_train_split_climbs_a_level_and_a_resumed_run_stays_there(tmp_path, tiny_model_dir):
    (tmp_path / "task.yaml").write_text(f"""
name: climb
seed: 1
task:
  description: arithmetic
  dataset: {{kind: reasoning_gym, name: basic_arithmetic, size: 40,
            options: {{min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}}}
  splits: {{train: 4, val: 4, test: 4}}
graphs: [{ROOT}/graphs/direct.yaml]
policy: {{kind: hf, model: {tiny_model_dir}, dtype: float32}}
evolve: {{generations: 2, children: 0}}
rl: {{enabled: true, every: 1, steps: 1, group_size: 2, inputs_per_step: 2,
      curriculum: {{enabled: true, levels: [{{min_digits: 3, max_digits: 3}}], promote_at: 0.0}}}}
""")
    spec = runner.prepare(tmp_path / "task.yaml", output=str(tmp_path / "pop"))
    asyncio.run(runner.run(spec))
    with Archive(spec.run_dir, write=False) as a:
        assert a.meta(LEVEL_KEY) == 1
        trained = {t.input_id for t in a.trajectories_of_inputs("train", [f"L1-basic_arithmetic-{i}" for i in range(4)])}
        assert trained  # the second phase drew its inputs from level 1 (and archived them)
    with Archive(spec.run_dir) as a:
        resumed = Search(spec, ScriptedBackend(), ScriptedBackend(), a)
        train = resumed.splits["train"]
        assert all(e.id.startswith("L1-") for e in train)
        assert all(len(n) == 3 for e in train for n in e.input.replace("=", " ").split() if n.isdigit())


def test_a_level_never_trains_on_a_held_out_question():
    from pathlib import Path

    from evoagent.rl.config import CurriculumConfig
    from evoagent.rl.curriculum import train_at
    from evoagent.spec.config import DatasetConfig

    data = DatasetConfig(kind="reasoning_gym", name="chain_sum",
                         options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    cfg = CurriculumConfig(enabled=True, levels=({"min_terms": 3, "max_terms": 3},))
    free = train_at(1, data, cfg, 20, 0, Path("."))
    held = {e.input for e in free[:5]}  # say these five were val or test questions
    kept = train_at(1, data, cfg, 20, 0, Path("."), held)
    assert len(kept) == 20 and not {e.input for e in kept} & held
    assert [e.id for e in kept][:15] == [e.id for e in free][5:]  # the same draw, minus the held ones
