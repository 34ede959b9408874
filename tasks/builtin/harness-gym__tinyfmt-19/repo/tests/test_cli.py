from tinyfmt import split_paragraphs, wrap_text
from tinyfmt.commands.main import main


def test_wrap_text_wraps_each_paragraph():
    text = "one two three four five\n\nsix seven"
    assert wrap_text(text, width=9) == "one two\nthree\nfour five\n\nsix seven"


def test_split_paragraphs_ignores_extra_blank_lines():
    assert split_paragraphs("a\n\n\n\nb\n") == ["a", "b"]


def test_main_reads_stdin_and_writes_stdout(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("aa bb cc"))
    assert main(["--width", "5"]) == 0
    assert capsys.readouterr().out == "aa bb\ncc\n"


def test_main_prints_its_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "tinyfmt 1.3.0"
