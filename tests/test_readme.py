"""The README's quick start runs as written and does what it says."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _quick_start():
    text = README.read_text()
    section = text[text.index("## Quick start"):text.index("## How it works")]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_quick_start_trains_explains_and_writes_its_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)      # (a fresh folder: the report's folder is made)
    exec(compile(_quick_start(), "README quick start", "exec"), {})
    assert "run compiled" in capsys.readouterr().out
    report = (tmp_path / "reports" / "mine.html").read_text()
    assert "plain Keras" in report and "kerasjit" in report
