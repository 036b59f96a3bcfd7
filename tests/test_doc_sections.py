"""benchmarks/doc_sections.py: a benchmark rewrites its own section of docs/benchmarks.md between
its markers, leaves the others and the measurements log alone, and adds a first section before
the log."""

from benchmarks.doc_sections import LOG, replace_section


def test_a_section_is_replaced_in_place_and_a_new_one_goes_before_the_log(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "# Benchmarks\n\n<!-- a:begin -->\nold a\n<!-- a:end -->\n\n<!-- b:begin -->\nb\n<!-- b:end -->\n\n"
        f"{LOG}\n\n2026-11-22: history\n"
    )
    replace_section(doc, "a", "new a\n")
    replace_section(doc, "c", "c")
    assert doc.read_text() == (
        "# Benchmarks\n\n<!-- a:begin -->\nnew a\n<!-- a:end -->\n\n<!-- b:begin -->\nb\n<!-- b:end -->\n\n"
        f"<!-- c:begin -->\nc\n<!-- c:end -->\n\n{LOG}\n\n2026-11-22: history\n"
    )


def test_without_a_log_a_new_section_goes_last(tmp_path):
    doc = tmp_path / "benchmarks.md"
    replace_section(doc, "a", "a")
    assert doc.read_text().endswith("<!-- a:begin -->\na\n<!-- a:end -->\n")
