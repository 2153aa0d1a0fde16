"""The hand-off model answers the conversation the local model saw: the system turn it is sent
is the local prompt's system text (facts joined as `needle_wire.render_system` joins them, the
date fact with `auto_date`), not a second rendering of the facts."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import toy_model_path

import needlepoint
from needlepoint.api.handoff import Handoff

TOOL = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
        "parameters": {"type": "object", "properties": {"time": {"type": "string"}},
                       "required": ["time"]}}
QUERY = "wake me up at 06:45"


class Recording(Handoff):
    """A hand-off that records what it would send and answers with one fixed call."""

    def ask(self, messages, tools, options) -> dict[str, Any]:
        object.__setattr__(self, "sent", list(messages))
        return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("auto_date", [False, True])
def test_the_handoff_sees_the_system_text_the_local_model_saw(auto_date) -> None:
    handoff = Recording("http://127.0.0.1:9/v1", "big", below=1.0)
    system = {"user_name": "Ana", "city": "Oslo"}
    needle = needlepoint.Needle(tools=[TOOL], model=toy_model_path(), system=system,
                                auto_date=auto_date, handoff=handoff)
    envelope = needle.complete(QUERY)
    assert envelope["handoff"]["answered"] and envelope["text"] == "ok"
    local = needle.tokenizer.decode(needle.prompt_ids(QUERY))
    sent = handoff.sent
    assert sent[0] == {"role": "system", "content": needle.system_text()}
    assert sent[0]["content"].startswith("user_name: Ana; city: Oslo")  # as the wire joins
    assert sent[0]["content"] in local  # the very text of the local prompt
    assert sent[1] == {"role": "user", "content": QUERY}
