"""The command line: cache-plan from the config alone, generate on a tiny model, one-line errors."""
import subprocess
import sys

from muser.testing import tiny_model_dir


def muser(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "muser.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_cache_plan_of_embedded_model_prints_both_planes(tmp_path):
    png = tmp_path / "plan.png"
    r = muser("cache-plan", "--context", "32768", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    # 15 sliding layers x 512 rows x 1,024 B (bf16 K+V, 1 head of 256) and 3 full x 32,768 rows.
    assert f"{15 * 512 * 1024:,} B" in r.stdout
    assert f"{3 * 32768 * 1024:,} B" in r.stdout
    assert png.stat().st_size > 1000


def test_generate_streams_text_on_a_tiny_model():
    path = tiny_model_dir("gemma3", window=4)
    r = muser("generate", "hello world", "--model", str(path), "--max-tokens", "8", "--seed", "1",
              "--temperature", "0.8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() != "" or r.stdout == "\n"


def test_bad_arguments_give_one_clear_line():
    r = muser("generate", "hi", "--model", "/no/such/model.gguf")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no such path" in r.stderr
    assert "Traceback" not in r.stderr
    r = muser("cache-plan", "--context", "-5")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_resume_and_save_continue_a_session_across_processes(tmp_path):
    path = str(tiny_model_dir("gemma3", window=4))
    pack = tmp_path / "s.pack"
    r = muser("generate", "the quick brown fox", "--model", path, "--max-tokens", "5", "--save", str(pack))
    assert r.returncode == 0, r.stderr
    r2 = muser("generate", " jumps", "--model", path, "--max-tokens", "5", "--resume", str(pack),
               "--save", str(pack))
    assert r2.returncode == 0, r2.stderr
    assert "saved" in r2.stderr


def test_chat_answers_each_line_and_exits_on_eof():
    path = str(tiny_model_dir("gemma3", window=4))
    r = subprocess.run([sys.executable, "-m", "muser.cli", "chat", "--model", path, "--max-tokens", "4",
                        "--system", "be brief"], input="hello\nhow are you?\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("you> ") == 3 and r.stdout.count("model> ") == 2
    assert "Traceback" not in r.stderr


def test_chat_keeps_its_cache_between_turns():
    """Turn 2's prompt re-renders turn 1: at least turn 1's prompt comes from the cache, never
    prefilled again (the reply too, when it re-tokenizes as sampled)."""
    import re
    path = str(tiny_model_dir("gemma3", window=4))
    r = subprocess.run([sys.executable, "-m", "muser.cli", "chat", "--model", path, "--max-tokens", "4",
                        "--stats"], input="hello\nhow are you?\nand then?\n", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    turns = [tuple(map(int, m)) for m in re.findall(r"\[prompt (\d+) tokens, (\d+) reused", r.stderr)]
    assert len(turns) == 3, r.stderr
    assert turns[0][1] == 0
    for (prev_len, _), (length, reused) in zip(turns, turns[1:]):
        assert prev_len - 1 <= reused < length       # everything up to the last reply is reused


def test_chunk_size_option_reaches_the_engine():
    from muser.cli import build_parser, load_engine
    path = str(tiny_model_dir("gemma3", window=4))
    args = build_parser().parse_args(["generate", "hi", "--model", path, "--chunk-size", "7"])
    assert load_engine(args).config.chunk_size == 7
    r = muser("generate", "hi", "--model", path, "--chunk-size", "0")
    assert r.returncode != 0 and "chunk" in r.stderr and "Traceback" not in r.stderr
