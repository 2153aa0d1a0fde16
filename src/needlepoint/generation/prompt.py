"""The Needle chat wire format (moved to `formats/needle_wire.py`, where every model's chat
format lives: `formats/chat_format.py`); re-exported here for the generation layer."""

from ..formats.needle_wire import (  # noqa: F401
    IM_END,
    IM_START,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    compact_json,
    continuation_ids,
    date_fact,
    prompt_ids,
    render_prompt,
    render_system,
    render_tool_results,
    render_user_turn,
    turn_prefix_ids,
    with_date,
)
