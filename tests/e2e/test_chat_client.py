"""`ds41rt chat`, the terminal client, against the server as a user would drive it: lines on
stdin, streamed replies on stdout. Greedy output is deterministic, so what the client prints for
a turn must equal what the official openai client gets for the same conversation, whole.
"""
import subprocess

from conftest import API_KEY, MODEL_ID, _binary

NO_THINK = {"thinking": {"type": "disabled"}}


def run_chat(server, stdin: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(_binary()), "chat", "--url", server.base, "--max-tokens", "6", "--no-thinking", *extra],
                          input=stdin, capture_output=True, text=True, timeout=120)


def reply(client, messages):
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=6, extra_body=NO_THINK)
    return r.choices[0].message.content or ""


def test_chat_client_two_turns_match_the_api(server, client):
    p = run_chat(server, "Hello\nHow are you?\n", "--api-key", API_KEY)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    first = reply(client, [{"role": "user", "content": "Hello"}])
    # The second turn carries the first reply as the assistant's message.
    second = reply(client, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": first},
                            {"role": "user", "content": "How are you?"}])
    assert p.stdout == first + "\n" + second + "\n", (lines, first, second)


def test_chat_client_reset_and_errors(server, client):
    # /reset forgets the first turn: the second reply is the one of a fresh conversation.
    p = run_chat(server, "Hello\n/reset\nHello\n/quit\nnot sent\n", "--api-key", API_KEY)
    assert p.returncode == 0, p.stderr
    first = reply(client, [{"role": "user", "content": "Hello"}])
    assert p.stdout == first + "\n" + first + "\n"
    # A wrong key: the server's reason on stderr, a failing exit status, no hang.
    p = run_chat(server, "Hello\n", "--api-key", "wrong", "--model", MODEL_ID)
    assert p.returncode == 1
    assert "HTTP 401" in p.stderr
    # No server there: a clear message, exit 1.
    p = subprocess.run([str(_binary()), "chat", "--url", "http://127.0.0.1:9"], input="Hello\n", capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "cannot reach http://127.0.0.1:9" in p.stderr
