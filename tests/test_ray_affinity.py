"""serve --ray's prefix affinity without Ray (cluster/affinity.py and the dispatcher's rule):
a prompt's prefixes named by block hashes, the longest known one wins, the table is bounded,
and an online line follows its prefix unless that worker's queue is much longer."""
from __future__ import annotations

from llamabatch.cluster.affinity import BLOCK_BYTES, PrefixAffinity, prefix_keys
from llamabatch.cluster.dispatch import Dispatcher, Line, WorkerState
from llamabatch.cluster.plan import WorkerTally

SYSTEM = {"role": "system", "content": "You are a terse assistant. " * 8}


def conversation(turns: int, topic: str) -> list[dict]:
    messages = [SYSTEM]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{topic}: question {i}, " + "with some detail " * 4})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {i} " * 10})
    return messages


def test_a_chats_next_turn_starts_with_every_prefix_of_the_turn_before():
    one, two = prefix_keys(conversation(1, "cats")), prefix_keys(conversation(2, "cats"))
    assert len(one) >= 3 and two[:len(one) - 1] == one[:-1]  # the last block of turn 1 holds its end
    assert prefix_keys("x" * (BLOCK_BYTES - 1)) == []  # shorter than a block: no affinity
    assert prefix_keys([1, 2, 3] * 40)[:2] == prefix_keys([1, 2, 3] * 80)[:2]  # token ids too


def test_the_longest_known_prefix_wins_and_the_table_is_bounded():
    a = PrefixAffinity(max_entries=50)
    cats, dogs = prefix_keys(conversation(2, "cats")), prefix_keys(conversation(2, "dogs"))
    a.remember(cats, "w1")
    a.remember(dogs, "w2")  # the shared system prompt's blocks now say w2
    assert a.worker_for(prefix_keys(conversation(3, "cats"))) == "w1"
    assert a.worker_for(prefix_keys(conversation(3, "dogs"))) == "w2"
    assert a.worker_for(prefix_keys(conversation(1, "birds"))) == "w2"  # only the system prompt is known
    a.remember(prefix_keys("z" * BLOCK_BYTES * 60), "w3")
    assert len(a) == 50 and a.worker_for(cats) is None  # the oldest forgotten first


def test_an_online_line_follows_its_prefix_unless_that_queue_is_much_longer():
    workers = [WorkerState(WorkerTally(f"w{i}", "10.0.0.1", 1, 1), 8, 4) for i in (1, 2)]
    sent: list[tuple[int, str]] = []
    d = Dispatcher(workers, lambda line, w: sent.append((line.key, w.tally.name)), lambda line: None,
                   urgent_below=0, affinity=PrefixAffinity())
    key = iter(range(100))

    def online(prompt) -> str:
        d.submit(Line(next(key), prompt, None, priority=-1, prefixes=prefix_keys(prompt)))
        return sent[-1][1]

    def batch(n: int) -> None:
        for _ in range(n):
            d.submit(Line(next(key), "batch", None))

    assert online(conversation(1, "cats")) == "w1"  # nothing known: the shortest queue (a tie: the first)
    batch(1)  # w2 (the shortest)
    assert online(conversation(1, "dogs")) == "w1"  # the shared system prompt ran on w1, now 1 vs 1
    assert online(conversation(2, "cats")) == "w1"  # w1: 2 in flight, w2: 1; within half its 4 slots
    batch(1)  # w2: 2
    assert online(conversation(2, "dogs")) == "w1"  # w1: 3 <= 2 + 2
    assert online(conversation(3, "cats")) == "w1"  # w1: 4 <= 2 + 2
    assert online(conversation(3, "dogs")) == "w2"  # w1: 5 > 2 + 2: busy, not chosen
    assert online(conversation(4, "dogs")) == "w2"  # and its prefix is on w2 from now on
    batch(1)  # batch lines go by queue length alone (w1: 5, w2: 4)
    assert sent[-1][1] == "w2"
