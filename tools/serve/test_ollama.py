#!/usr/bin/env python3
"""ferrox serve's Ollama API against the official `ollama` Python client.

Usage: FERROX_HOST=http://127.0.0.1:8080 [FERROX_API_KEY=k] python3 test_ollama.py
(run_tests.sh starts a server and runs this.) Every check runs; exits
non-zero if any failed, naming it.
"""
import math
import os

import ollama

from checks import check, run_checks

HOST = os.environ.get("FERROX_HOST", "http://127.0.0.1:8080")
KEY = os.environ.get("FERROX_API_KEY")
headers = {"Authorization": f"Bearer {KEY}"} if KEY else {}
client = ollama.Client(host=HOST, headers=headers, timeout=300)
MODEL = "gemma3:270m"
MSG = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY = {"temperature": 0, "num_predict": 24}


@check
def list_names_the_served_model():
    models = client.list().models
    assert len(models) == 1, models
    m = models[0]
    assert m.model and m.size > 0 and m.details.format == "gguf", m
    assert m.details.family == "gemma3", m.details


@check
def show_gives_the_template_and_details():
    r = client.show(MODEL)
    assert r.template and "start_of_turn" in r.template, r.template
    assert r.details.quantization_level == "Q4_K_M", r.details
    assert r.modelinfo["general.architecture"] == "gemma3"
    assert "completion" in r.capabilities


@check
def chat_answers_in_one_object():
    r = client.chat(model=MODEL, messages=MSG, options=GREEDY)
    assert r.done and r.done_reason in ("stop", "length"), r
    assert r.message.role == "assistant" and r.message.content.strip(), r.message
    assert 0 < r.eval_count <= 24 and r.prompt_eval_count > 0, r
    assert r.total_duration >= r.eval_duration > 0, r
    print(f"      chat: {r.message.content!r} ({r.eval_count} tokens, {r.eval_count / r.eval_duration * 1e9:.1f} t/s)")


@check
def chat_streams_the_same_text():
    pieces, last = [], None
    for part in client.chat(model=MODEL, messages=MSG, options=GREEDY, stream=True):
        pieces.append(part.message.content)
        last = part
    whole = client.chat(model=MODEL, messages=MSG, options=GREEDY)
    assert len(pieces) > 2, pieces
    assert last.done and last.eval_count == whole.eval_count, last
    assert "".join(pieces) == whole.message.content, (pieces, whole.message.content)


@check
def chat_with_a_json_schema_format_parses():
    import json

    schema = {"type": "object", "properties": {"sea": {"type": "string", "maxLength": 20}, "deep": {"type": "boolean"}}, "required": ["sea", "deep"]}
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Describe the sea as JSON."}], format=schema, options={"temperature": 0, "num_predict": 200})
    v = json.loads(r.message.content)
    assert isinstance(v["deep"], bool) and isinstance(v["sea"], str), v


@check
def generate_completes_a_prompt():
    # The first run evaluates the prompt as one batch; later ones reuse its cache and evaluate the last
    # token alone. Products of a batch and of one token sum in a different order, which can move a
    # greedy token at a near tie, so the replies compared here all come from a reused prefix.
    client.generate(model=MODEL, prompt="The capital of France is", options=GREEDY)
    r = client.generate(model=MODEL, prompt="The capital of France is", options=GREEDY)
    assert r.done and r.response.strip(), r
    assert r.context and len(r.context) == r.prompt_eval_count + r.eval_count, r
    streamed = "".join(p.response for p in client.generate(model=MODEL, prompt="The capital of France is", options=GREEDY, stream=True))
    assert streamed == r.response, (streamed, r.response)
    print(f"      generate: {r.response!r}")


@check
def generate_raw_and_num_predict():
    r = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"temperature": 0.7, "seed": 3, "num_predict": 5})
    assert r.eval_count <= 5, r
    again = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options={"temperature": 0.7, "seed": 3, "num_predict": 5})
    assert again.response == r.response, "a seed reproduces the reply"


@check
def embed_gives_unit_vectors():
    r = client.embed(model=MODEL, input=["The sea is deep.", "The ocean is vast.", "Tax forms are due in April."])
    assert len(r.embeddings) == 3 and len(r.embeddings[0]) == 640, [len(e) for e in r.embeddings]
    for e in r.embeddings:
        assert abs(math.sqrt(sum(x * x for x in e)) - 1) < 1e-4
    cos = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731 - unit vectors
    sea_ocean, sea_tax = cos(r.embeddings[0], r.embeddings[1]), cos(r.embeddings[0], r.embeddings[2])
    print(f"      embed: cos(sea, ocean) = {sea_ocean:.3f}, cos(sea, tax) = {sea_tax:.3f}")
    one = client.embed(model=MODEL, input="The sea is deep.")
    assert cos(one.embeddings[0], r.embeddings[0]) > 0.999
    old = client.embeddings(model=MODEL, prompt="The sea is deep.")
    assert cos(old.embedding, r.embeddings[0]) > 0.999


@check
def errors_raise_response_error():
    try:
        client.chat(model=MODEL, messages=MSG, options={"temperature": 9})
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "temperature" in e.error, (e.status_code, e.error)
    else:
        raise AssertionError("temperature 9 was accepted")


@check
def ps_lists_the_loaded_model():
    r = client.ps()
    assert len(r.models) == 1 and r.models[0].name, r


def main():
    run_checks(f"ollama client {ollama_version()}")


def ollama_version():
    try:
        from importlib.metadata import version

        return version("ollama")
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    main()
