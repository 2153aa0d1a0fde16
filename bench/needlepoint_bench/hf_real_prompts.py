"""The texts of `needlepoint-bench-hf-real`: four fidelity prompts of different kinds (prose,
code, a tool call, a technical explanation) and the speed text (`hf.TEXT` followed by all
four), long enough for a ~500-token prefill and 128 teacher-forced decode steps with any of
the benchmarked tokenizers."""

from __future__ import annotations

from .hf import TEXT

PROSE = (
    "In the old harbour town the bakers rose long before the fishermen. By four in the morning "
    "the ovens on Quay Street were already hot, and the smell of rye and caraway drifted down "
    "to the water where the boats rocked against their moorings. Marta had worked the night "
    "shift for eleven years. She knew every sound of the building: the sigh of the proofing "
    "cabinet, the tick of the cooling racks, the particular groan of the third step on the "
    "stairs. When the new owner suggested buying a machine to shape the loaves, she asked him "
    "to spend one night beside her first, and in the morning he quietly cancelled the order."
)
CODE = '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals and return them sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [ordered[0]]
    for start, end in ordered[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


class LRUCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: dict[str, int] = {}

    def get(self, key: str) -> int | None:
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value
'''
TOOL_CALL = (
    'You can call these tools: [{"name": "get_weather", "description": "Current weather for '
    'a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, '
    '"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}, '
    '{"name": "set_alarm", "description": "Set an alarm", "parameters": {"type": "object", '
    '"properties": {"time": {"type": "string", "description": "HH:MM, 24-hour clock"}, '
    '"label": {"type": "string"}}, "required": ["time"]}}]\n'
    "User: What is the weather like in Lisbon right now, in celsius? And wake me at 6:45 "
    "tomorrow for the early train.\n"
    'Assistant: [{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}}, '
    '{"name": "set_alarm", "arguments": {"time": "06:45", "label": "early train"}}]'
)
TECHNICAL = (
    "A B-tree keeps its keys sorted in nodes that each hold between t - 1 and 2t - 1 keys, so "
    "that every leaf sits at the same depth. Searching walks from the root, choosing at each "
    "node the child whose key range contains the target; because a node fills a whole disk "
    "page, the height stays small and a lookup touches only a handful of pages. Insertion "
    "adds the key to a leaf and, when the leaf overflows, splits it around its median, "
    "pushing the median up into the parent; a split can propagate to the root, which is the "
    "only way the tree grows taller. Deletion is the mirror image: a node that falls below "
    "the minimum borrows a key from a sibling or merges with it."
)
PROMPTS = {"prose": PROSE, "code": CODE, "tool call": TOOL_CALL, "technical": TECHNICAL}
SPEED_TEXT = "\n\n".join([TEXT, *PROMPTS.values()])
