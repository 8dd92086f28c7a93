from __future__ import annotations

from runs.engine.parsing import FinalInText, code_blocks, final_in_text


def test_it_finds_repl_blocks_in_order():
    reply = "First:\n```repl\nx = 1\n```\nthen\n```python\nprint(x)\n```\n```bash\nls\n```"
    assert code_blocks(reply) == ["x = 1", "print(x)"]


def test_it_finds_blocks_whose_lines_end_in_crlf():
    assert code_blocks("```repl\r\nx = 'a'\r\nprint(x)\r\n```") == ["x = 'a'\nprint(x)"]


def test_it_reads_final_in_prose():
    assert final_in_text("I am done.\nFINAL(42)") == FinalInText(answer="42")
    assert final_in_text('FINAL("a (nested) answer")') == FinalInText(answer="a (nested) answer")


def test_it_reads_final_var_in_prose():
    assert final_in_text("FINAL_VAR(answer)") == FinalInText(variable="answer")
    assert final_in_text("FINAL_VAR('result')") == FinalInText(variable="result")


def test_it_ignores_final_inside_code_and_mid_sentence():
    assert final_in_text("```repl\nFINAL(1)\n```") is None
    assert final_in_text("I will call FINAL(x) later") is None
