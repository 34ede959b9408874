"""A generated task family with a train/held-out split: small repos, one planted bug each.

    from harness_gym.tasks import load_tasks
    train = load_tasks("family:train")      # 200 tasks, generated into the cache on first use
    heldout = load_tasks("family:heldout")  # 50 tasks whose names never occur in training

Each task is one short Python file at the repo root (two or three small functions, one of them
wrong in one line: a constant, a comparison, an off-by-one, a string, swapped arguments, an
operator, an index, a default, a negation, a rounding), a short test file, and a problem
statement that names the file, the function, a call with its wrong and right value and the rule
it breaks, so the fix follows from reading the file. Sized for a 135M-parameter model driving a
real CLI: the file is ~15-25 lines.

Modules: `names` (the fixed vocabulary split), `bugs` (the kinds), `suite` (drawing, writing,
the in-process self-check), `store` (the cache behind the `family` entry point and
`validate_family`), `cli` (`harness-gym tasks generate|validate`), `symptom` (the harder tier,
`load_tasks("family-symptom:train")`: the bug sits in a helper another module calls, and the
statement quotes only the wrong result).
"""

from __future__ import annotations

from .bugs import KINDS
from .names import HELDOUT_NOUNS, SPLITS, TRAIN_NOUNS
from .store import (
    DEFAULT_SIZES,
    family_dir,
    load_family,
    load_symptom_family,
    symptom_dir,
    validate_family,
)
from .suite import FAMILY_VERSION, FamilyTask, SelfCheckError, generate_split, write_family
from .symptom import SYMPTOM_VERSION, SymptomTask, generate_symptom_split, write_symptom_family

__all__ = [
    "DEFAULT_SIZES",
    "FAMILY_VERSION",
    "HELDOUT_NOUNS",
    "KINDS",
    "SPLITS",
    "SYMPTOM_VERSION",
    "TRAIN_NOUNS",
    "FamilyTask",
    "SelfCheckError",
    "SymptomTask",
    "family_dir",
    "generate_split",
    "generate_symptom_split",
    "load_family",
    "load_symptom_family",
    "symptom_dir",
    "validate_family",
    "write_family",
    "write_symptom_family",
]
