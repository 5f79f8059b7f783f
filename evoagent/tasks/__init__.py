"""Tasks: datasets and splits, answer extractors, rewards."""

from evoagent.tasks import code  # noqa: F401  (registers humaneval, the code extractor, unit_tests)
from evoagent.tasks.datasets import Example, known_datasets, load_examples, split
from evoagent.tasks.envs import known_environments, make_episode
from evoagent.tasks.extract import get_extractor, known_extractors
from evoagent.tasks.rewards import known_rewards, score

__all__ = [
    "Example",
    "get_extractor",
    "known_datasets",
    "known_environments",
    "known_extractors",
    "known_rewards",
    "load_examples",
    "make_episode",
    "score",
    "split",
]
