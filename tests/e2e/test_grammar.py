"""Constrained decoding through the OpenAI API: forced tool calls and response_format.

The tiny random-weight model never writes a DSML tool call or JSON by itself; with tool_choice
"required" / a named function, or a JSON response_format, the server's grammar (XGrammar) masks
the sampler so the output must be one. The checks are independent of the server's grammar: the
official client's parsed tool_calls, json.loads, and the `jsonschema` package as the validator.
Schemas use enums and bounded integers so a random model finishes in a few dozen tokens; every
request still has a max_tokens bound. Thinking is off (a random model would never close <think>;
in thinking mode the constraint starts after </think>).
"""
import json

import httpx
import jsonschema
import openai
import pytest

from conftest import API_KEY, MODEL_ID

NO_THINK = {"thinking": {"type": "disabled"}}
MSGS = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast of a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time of a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                                          "required": ["city"], "additionalProperties": False}}},
]
PARAMS_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def chat(client, **kw):
    args = dict(model=MODEL_ID, messages=MSGS, max_tokens=400, tools=TOOLS)
    extra = dict(NO_THINK)
    extra.update(kw.pop("extra_body", {}))
    args.update(kw)
    return client.chat.completions.create(extra_body=extra, **args)


def check_calls(calls, names):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function"
        assert c.function.name in names
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, PARAMS_OF[c.function.name])


def test_required_tool_call(client):
    r = chat(client, tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert len(c.message.tool_calls) == 1
    check_calls(c.message.tool_calls, {"get_weather", "get_time"})
    assert not c.message.content
    print("\nrequired tool call response:", r.model_dump_json(indent=1))


def test_required_parallel_tool_calls(client):
    # Parallel calls allowed (the default): a random greedy model may keep adding calls until
    # max_tokens; every call the client gets is still complete and valid.
    r = chat(client, tool_choice="required", max_tokens=500)
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length")
    check_calls(c.message.tool_calls, {"get_weather", "get_time"})


def test_named_tool_call_sampled_and_streamed(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = chat(client, tool_choice=named, parallel_tool_calls=False, temperature=1.0, seed=7)
    c = whole.choices[0]
    assert c.finish_reason == "tool_calls"
    assert len(c.message.tool_calls) == 1
    check_calls(c.message.tool_calls, {"get_weather"})

    stream = chat(client, tool_choice=named, parallel_tool_calls=False, temperature=1.0, seed=7, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            if tc.function and tc.function.name:
                slot["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == json.loads(c.message.tool_calls[0].function.arguments)


def test_tool_result_follow_up(client):
    first = chat(client, tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0].message
    assert first.tool_calls
    call = first.tool_calls[0]
    msgs = MSGS + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"time": "14:05"})},
    ]
    r = chat(client, messages=msgs, max_tokens=8, tool_choice="none")
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert not c.message.tool_calls
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens >= 1


def test_response_format_json_schema_and_object(client):
    schema = {"type": "object",
              "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                             "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
                             "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]},
                                      "maxItems": 2}},
              "required": ["answer", "confidence", "tags"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}
    for temperature in (None, 1.0):
        kw = {} if temperature is None else {"temperature": temperature, "seed": 3}
        r = chat(client, tools=openai.NOT_GIVEN, response_format=rf, max_tokens=200, **kw)
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.message.content), schema)
    r = chat(client, tools=openai.NOT_GIVEN, response_format={"type": "json_object"}, max_tokens=48)
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:  # a random model may keep writing keys; what it wrote is still an object's prefix
        assert c.message.content.startswith("{")


def test_bad_constraints_are_400_and_server_keeps_serving(server, client):
    cases = [
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
        (dict(tool_choice="sometimes"), "tool_choice"),
        (dict(tools=openai.NOT_GIVEN, tool_choice="required"), "tool_choice"),
        (dict(tools=openai.NOT_GIVEN, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}),
         "response_format.json_schema.schema"),
        (dict(tools=openai.NOT_GIVEN, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "string"}}, "not": {"required": ["a"]}}}}),
         "response_format.json_schema.schema.not"),
        (dict(tool_choice="required", response_format={"type": "json_object"}), "response_format"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, **kw)
        assert e.value.status_code == 400
        assert e.value.body["type"] == "invalid_request_error"
        assert e.value.body["param"] == param, e.value.body
    # Raw HTTP too: the error body has the OpenAI shape.
    resp = httpx.post(server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": MODEL_ID, "messages": MSGS, "tools": TOOLS, "max_tokens": 4,
                            "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert resp.status_code == 400
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    r = chat(client, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
