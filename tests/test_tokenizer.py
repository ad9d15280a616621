"""kvcli.tokenizer against transformers' fast tokenizer on the same files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcli.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

TEXTS = [
    "Once upon a time there was a little fox.",
    "  leading spaces, tabs\tand\n\nblank lines  ",
    "The fox 🦊 jumps: 日本語のテキスト — naïve café, 👩‍👩‍👧 family",
    "<|im_start|>user\nhi there<|im_end|>\n<|endoftext|>",
    "<s> x </s> <unk>",
    "",
    "Hello world!!! ??? it's don't, isn't it?",
]
MESSAGES = [
    {"role": "system", "content": "Be brief & exact <always>."},
    {"role": "user", "content": "What is 2+2? ünïcödé 🦊"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & später",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
# Exercises the environment transformers builds: loop controls, namespace,
# dict(), tojson options, the generation tag, strftime_now, special tokens.
FEATURE_TEMPLATE = (
    "{%- set ns = namespace(count=0) %}"
    "{{- bos_token if bos_token is defined else '' }}"
    "{%- for m in messages %}{%- if loop.index > 3 %}{% break %}{% endif %}"
    "{%- set ns.count = ns.count + 1 %}"
    "{%- if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}"
    "{%- else %}{{ m.role }}: {{ m.content | trim }}\n{%- endif %}{%- endfor %}"
    "{{ dict(a=1, b='<x>') | tojson(indent=2, sort_keys=True) }}"
    "{{ tools | tojson(separators=(',', ':')) if tools else '' }}"
    "{{ strftime_now('%Y') | length }} {{ ns.count }} {{ eos_token }}"
)


@lru_cache(maxsize=8)
def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(params=["tiny", "stories"])
def model_dir(request: pytest.FixtureRequest, tiny_models) -> Path:
    if request.param == "tiny":
        return tiny_models["llama"]
    return request.getfixturevalue("stories_dir")


def test_encode_and_decode_equal_transformers(model_dir: Path) -> None:
    ours, theirs = Tokenizer.from_dir(model_dir), hf_tokenizer(model_dir)
    for text in TEXTS:
        for add_special in (True, False):
            ids = ours.encode(text, add_special_tokens=add_special)
            assert ids == theirs.encode(text, add_special_tokens=add_special), (text, add_special)
            for skip in (True, False):
                expected = theirs.decode(ids, skip_special_tokens=skip)
                assert ours.decode(ids, skip_special_tokens=skip) == expected
    assert ours.encode_batch(TEXTS, add_special_tokens=True) == [ours.encode(t) for t in TEXTS]
    assert ours.vocab_size == len(theirs)


def test_special_token_properties(tiny_models, stories_dir: Path) -> None:
    tiny = Tokenizer.from_dir(tiny_models["llama"])
    im_end, endoftext = tiny.token_to_id("<|im_end|>"), tiny.token_to_id("<|endoftext|>")
    assert tiny.eos_token_ids == (im_end, endoftext)  # generation_config's, tokenizer eos folded in
    assert tiny.bos_token_id is None
    assert {im_end, endoftext, tiny.token_to_id("<|im_start|>")} <= tiny.all_special_ids
    stories = Tokenizer.from_dir(stories_dir)
    assert (stories.eos_token_ids, stories.bos_token_id, stories.vocab_size) == ((2,), 1, 512)
    assert stories.encode("Once")[0] == 1  # its post-processor adds <s>


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(tiny_models, add_generation_prompt: bool) -> None:
    path = tiny_models["llama"]
    ours, theirs = Tokenizer.from_dir(path), hf_tokenizer(path)
    for messages in (MESSAGES, MESSAGES[1:], MESSAGES[1:2]):
        for tools in (None, TOOLS):
            expected = theirs.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            got = ours.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_generation_prompt
            )
            assert got == expected
    assert "später" in ours.apply_chat_template(
        MESSAGES, tools=TOOLS
    )  # tojson without ASCII escapes


def test_feature_template_equals_transformers(tiny_models) -> None:
    path = tiny_models["llama"]
    ours, theirs = Tokenizer.from_dir(path), hf_tokenizer(path)
    for tools in (None, TOOLS):
        expected = theirs.apply_chat_template(
            MESSAGES, tools=tools, chat_template=FEATURE_TEMPLATE, tokenize=False
        )
        assert (
            ours.apply_chat_template(MESSAGES, tools=tools, chat_template=FEATURE_TEMPLATE)
            == expected
        )
    # None-valued keys are dropped before rendering, as transformers does.
    template = "{% for m in messages %}{{ m.get('name', 'anon') }}:{{ m.content }};{% endfor %}"
    messages = [{"role": "user", "content": "x", "name": None}]
    expected = theirs.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert ours.apply_chat_template(messages, chat_template=template) == expected == "anon:x;"


def test_template_from_tokenizer_config(tiny_models, tmp_path: Path) -> None:
    source = tiny_models["llama"]
    copy = tmp_path / "model"
    shutil.copytree(source, copy)
    template = (copy / "chat_template.jinja").read_text()
    (copy / "chat_template.jinja").unlink()
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    moved = Tokenizer.from_dir(copy)
    assert moved.chat_template == template
    assert moved.apply_chat_template(MESSAGES) == Tokenizer.from_dir(source).apply_chat_template(
        MESSAGES
    )


def test_template_errors(tiny_models, stories_dir: Path) -> None:
    tiny = Tokenizer.from_dir(tiny_models["llama"])
    with pytest.raises(jinja2.TemplateError, match="no system"):
        tiny.apply_chat_template(MESSAGES, chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        tiny.apply_chat_template(MESSAGES, chat_template="{% set ns = namespace(_x=1) %}")
    with pytest.raises(ValueError, match="empty"):
        tiny.apply_chat_template([])
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        tiny.apply_chat_template(["hello"])
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_dir(stories_dir).apply_chat_template(MESSAGES)


def test_missing_and_malformed_files(tiny_models, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    copy = tmp_path / "model"
    shutil.copytree(tiny_models["llama"], copy)
    (copy / "tokenizer_config.json").write_text('{\n  "eos_token": "<|im_end|>",\n  oops\n}')
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json:3:3: invalid JSON"):
        Tokenizer.from_dir(copy)


def test_token_bytes_rebuild_the_text(tiny_models, stories_dir: Path) -> None:
    tiny = Tokenizer.from_dir(tiny_models["llama"])
    for text in TEXTS:
        ids = tiny.encode(text, add_special_tokens=False)
        assert b"".join(tiny.token_bytes(i) for i in ids) == text.encode("utf-8")
    stories = Tokenizer.from_dir(stories_dir)
    ids = stories.encode("Once upon a time", add_special_tokens=False)
    assert b"".join(stories.token_bytes(i) for i in ids) == b" Once upon a time"
    with pytest.raises(ValueError, match="token_id"):
        tiny.token_bytes(10**6)


def _stream(tokenizer: Tokenizer, ids: list[int], prompt_ids: list[int] | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids or [])
    deltas = [detok.add(token_id) for token_id in ids]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


def test_incremental_detokenizer_holds_split_characters(model_dir: Path) -> None:
    tokenizer = Tokenizer.from_dir(model_dir)
    text = "Fox 🦊 and 日本語 — café 👩‍👩‍👧!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in delta for delta in deltas)
    if model_dir.name != "stories260K":  # its vocabulary maps some of these to <unk>
        assert "".join(deltas) == text
        assert deltas.count("") > 3  # emoji bytes arrived in several tokens and were held


def test_incremental_detokenizer_with_prompt_context(tiny_models, stories_dir: Path) -> None:
    for path in (tiny_models["llama"], stories_dir):
        tokenizer = Tokenizer.from_dir(path)
        prompt = tokenizer.encode("Once upon a time", add_special_tokens=False)
        output = tokenizer.encode(" the fox jumps over the lazy dog.", add_special_tokens=False)
        full = tokenizer.decode(prompt + output)
        expected = full[len(tokenizer.decode(prompt)) :]
        assert "".join(_stream(tokenizer, output, prompt)) == expected
        assert expected.startswith(" the")  # the leading space a bare decode would strip survives


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab 🦊日本é\n\u200d—"), max_size=40))
def test_incremental_equals_full_decode(tiny_models, text: str) -> None:
    tokenizer = Tokenizer.from_dir(tiny_models["llama"])
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert "".join(_stream(tokenizer, ids)) == tokenizer.decode(ids) == text


def test_tokenizer_never_imports_torch(tiny_models) -> None:
    code = (
        "import sys\n"
        "from kvcli.tokenizer import Tokenizer, IncrementalDetokenizer\n"
        f"t = Tokenizer.from_dir({str(tiny_models['llama'])!r})\n"
        "ids = t.encode('hello 🦊')\n"
        "assert t.decode(ids) == 'hello 🦊'\n"
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}])\n"
        "assert not {'torch', 'transformers'} & set(sys.modules), 'heavy import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
