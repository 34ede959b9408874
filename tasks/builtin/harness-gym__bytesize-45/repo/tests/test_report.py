from bytesize.cli import main
from bytesize.report import usage_table


def test_usage_table_is_sorted_and_totalled():
    assert usage_table({"a": 500, "bb": 2500}) == "bb     2.5 kB\na      500 B\ntotal  3.0 kB"


def test_cli_reports_a_directory(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "x.log").write_bytes(b"x" * 2000)
    (tmp_path / "notes.txt").write_bytes(b"y" * 10)
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "logs       2.0 kB",
        "notes.txt  10 B",
        "total      2.0 kB",
    ]
