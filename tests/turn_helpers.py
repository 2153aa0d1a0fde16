"""Tool schemas the generation and API tests share (the toy model's alarm and weather tools)."""

from __future__ import annotations

ALARM = {"name": "set_alarm", "description": "Set an alarm at a time of day.",
         "parameters": {"type": "object", "properties": {"time": {"type": "string"},
                                                         "label": {"type": "string"}},
                        "required": ["time"]}}
WEATHER = {"name": "get_weather", "description": "Get the weather forecast for a city.",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string"},
                                         "day": {"type": "string", "enum": ["today", "tomorrow"]}},
                          "required": ["city"]}}
