"""The rule catalogue. Divergence rules run in this order and the first that explains a
prompt's divergence claims it; structure and static rules then add what they see."""

from __future__ import annotations

from kvcli.audit.rules.base import AuditContext, PromptView, Rule
from kvcli.audit.rules.below_minimum import BelowMinimum
from kvcli.audit.rules.breakpoints import Breakpoints
from kvcli.audit.rules.dynamic_tools import DynamicTools
from kvcli.audit.rules.mid_prompt_edit import MidPromptEdit
from kvcli.audit.rules.model_switch import ModelSwitch
from kvcli.audit.rules.per_user_prefix import PerUserPrefix
from kvcli.audit.rules.unsorted_json import JsonConsistency, UnsortedJson
from kvcli.audit.rules.unstable_order import UnstableOrder
from kvcli.audit.rules.volatile_prefix import LatentVolatile, VolatilePrefix
from kvcli.audit.rules.whitespace_drift import WhitespaceDrift

RULE_CLASSES: tuple[type[Rule], ...] = (
    UnsortedJson,
    WhitespaceDrift,
    VolatilePrefix,
    UnstableOrder,
    PerUserPrefix,
    DynamicTools,
    MidPromptEdit,
    ModelSwitch,
    LatentVolatile,
    JsonConsistency,
    BelowMinimum,
    Breakpoints,
)

RULE_IDS: tuple[str, ...] = tuple(dict.fromkeys(cls.id for cls in RULE_CLASSES))


def make_rules(ctx: AuditContext) -> list[Rule]:
    return [cls(ctx) for cls in RULE_CLASSES]


__all__ = ["RULE_CLASSES", "RULE_IDS", "AuditContext", "PromptView", "Rule", "make_rules"]
