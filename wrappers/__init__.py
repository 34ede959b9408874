"""Gymnasium vector wrappers for training on harness episodes.

Stack them inside out in this order: the filters flag episodes, the advantage skips what they
flagged, and the recorder sees every column.

    envs = RecordTraces(GroupRelativeAdvantage(StalenessFilter(DropInfraErrors(vec_env),
                                                               current_version=7)), "runs/")
"""

from .drop_infra_errors import DropInfraErrors
from .group_relative_advantage import GroupRelativeAdvantage, group_advantages
from .record_traces import RecordTraces
from .staleness_filter import StalenessFilter, is_stale

__all__ = [
    "DropInfraErrors",
    "GroupRelativeAdvantage",
    "RecordTraces",
    "StalenessFilter",
    "group_advantages",
    "is_stale",
]
