"""Extractors: turn an agent's free-text output into the answer a reward compares.

A registry of ``fn(text) -> str``; an extractor that finds nothing returns ``""`` (scores 0),
never raises. Vote nodes use the same registry to decide which answers agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from evoagent.errors import SpecError
from evoagent.registry import Registry

Extractor = Callable[[str], str]
_REGISTRY: Registry[Extractor] = Registry("extractor", SpecError)
extractor = _REGISTRY.register  # ``@extractor("name")``: register ``fn(text) -> answer``
known_extractors = _REGISTRY.names
get_extractor = _REGISTRY.get
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


@extractor("raw")
def raw(text: str) -> str:
    """The whole output, stripped."""
    return text.strip()


@extractor("last_number")
def last_number(text: str) -> str:
    """The last number written (thousands separators dropped, trailing '.0' normalised)."""
    found = _NUMBER.findall(text)
    if not found:
        return ""
    num = found[-1].replace(",", "")
    if "." in num:
        num = num.rstrip("0").rstrip(".") or "0"
    return num


@extractor("answer_tag")
def answer_tag(text: str) -> str:
    """The content of the last ``<answer>...</answer>`` (reasoning-gym's convention)."""
    found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    return found[-1].strip() if found else ""


@extractor("after_answer")
def after_answer(text: str) -> str:
    """What follows the last 'Answer:' (ReAct convention), else the last line."""
    found = re.findall(r"(?i)answer\s*:\s*(.*)", text)
    if found:
        return found[-1].strip()
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""
