"""IncrementalDetokenizer: UTF-8 holdback, stop strings, and the deltas-join-to-text invariant."""
from __future__ import annotations

import random

import pytest

from llamabatch.core.scheduling.detok import IncrementalDetokenizer

REPLACEMENT = "\ufffd"


def feed(pieces, stop=(), finish=True):
    """Push every piece; return (detokenizer, list of deltas including finish's)."""
    detok = IncrementalDetokenizer(stop=stop)
    deltas = [detok.push(p) for p in pieces]
    if finish:
        deltas.append(detok.finish())
    return detok, deltas


def split_bytes(data: bytes, cuts) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[i:j] for i, j in zip(bounds, bounds[1:])]


def test_ascii_passes_straight_through():
    detok, deltas = feed([b"Hello", b",", b" world"], finish=False)
    assert deltas == ["Hello", ",", " world"]
    assert detok.text == "Hello, world"
    assert detok.finish() == ""
    assert not detok.stopped and detok.stop_hit is None


@pytest.mark.parametrize("cuts", [[1], [2], [3], [1, 2], [1, 3], [2, 3], [1, 2, 3]])
def test_emoji_split_never_yields_partial_chars(cuts):
    emoji = "🦙".encode()  # 4 bytes
    assert len(emoji) == 4
    detok, deltas = feed([b"a", *split_bytes(emoji, cuts), b"b"], finish=False)
    assert all(REPLACEMENT not in d for d in deltas)
    # Nothing of the emoji shows until its last byte arrives, then all of it at once.
    emoji_deltas = deltas[1:-1]
    assert emoji_deltas[:-1] == [""] * (len(emoji_deltas) - 1)
    assert emoji_deltas[-1] == "🦙"
    assert "".join(deltas) == detok.text == "a🦙b"


def test_cjk_split_across_tokens():
    data = "日本語".encode()  # 3 bytes per character
    pieces = [data[0:2], data[2:4], data[4:8], data[8:9]]
    detok, deltas = feed(pieces)
    assert deltas[:4] == ["", "日", "本", "語"]
    assert detok.text == "日本語"


def test_invalid_byte_in_middle_becomes_replacement_and_continues():
    detok, deltas = feed([b"ab", b"\xff", b"cd"], finish=False)
    assert deltas == ["ab", REPLACEMENT, "cd"]
    assert detok.text == "ab\ufffdcd"


def test_truncated_sequence_followed_by_ascii_does_not_stall():
    # \xe2\x82 starts a 3-byte character; "x" can't continue it.
    detok, deltas = feed([b"\xe2\x82", b"x"], finish=False)
    assert deltas == ["", REPLACEMENT + "x"]


def test_finish_replaces_incomplete_trailing_utf8():
    detok, deltas = feed([b"ok", "🦙".encode()[:2]], finish=False)
    assert deltas == ["ok", ""]
    assert detok.finish() == REPLACEMENT
    assert detok.text == "ok" + REPLACEMENT


def test_stop_inside_one_piece():
    detok, deltas = feed([b"Hi", b" there</s>after", b"more"], stop=["</s>"])
    assert deltas == ["Hi", " there", "", ""]
    assert detok.stopped and detok.stop_hit == "</s>"
    assert detok.text == "Hi there"


def test_stop_split_over_several_pieces_never_leaks():
    detok = IncrementalDetokenizer(stop=["</end>"])
    assert detok.push(b"x<") == "x"
    assert detok.push(b"/e") == ""
    assert detok.push(b"n") == ""
    assert detok.push(b"d>tail") == ""
    assert detok.stopped and detok.stop_hit == "</end>"
    assert detok.text == "x"
    assert detok.finish() == ""


def test_stop_split_inside_a_multibyte_character():
    stop = "→END"
    data = ("go" + stop).encode()
    arrow_start = 2
    pieces = [data[:arrow_start + 1], data[arrow_start + 1:arrow_start + 2], data[arrow_start + 2:]]
    detok, deltas = feed(pieces, stop=[stop])
    assert detok.stopped and detok.text == "go"
    assert "".join(deltas) == "go"


def test_stop_at_the_very_beginning():
    detok, deltas = feed([b"STOP", b"anything"], stop=["STOP"])
    assert deltas == ["", "", ""]
    assert detok.stopped and detok.text == ""


def test_prefix_of_stop_that_diverges_is_emitted():
    detok = IncrementalDetokenizer(stop=["###"])
    assert detok.push(b"a#") == "a"
    assert detok.push(b"#") == ""
    assert detok.push(b"b") == "##b"
    assert not detok.stopped
    assert detok.text == "a##b"


def test_earliest_stop_position_wins():
    # "\nUser:" is listed first but "###" occurs earlier in the text.
    detok, _ = feed([b"answer ### then\nUser: x"], stop=["\nUser:", "###"])
    assert detok.stop_hit == "###"
    assert detok.text == "answer "


def test_earliest_position_wins_when_both_complete_in_one_piece():
    # Both stops are complete once "CD" arrives; "ABCD" starts first, so it wins even
    # though "BC" ends first.
    detok, _ = feed([b"xAB", b"CD"], stop=["BC", "ABCD"])
    assert detok.stop_hit == "ABCD"
    assert detok.text == "x"


def test_stop_completing_in_an_earlier_piece_wins():
    detok, _ = feed([b"xABC", b"D"], stop=["ABCD", "BC"])
    assert detok.stop_hit == "BC"
    assert detok.text == "xA"


def test_same_position_prefers_longer_stop_present():
    detok, _ = feed([b"hi <|im_end|>"], stop=["<|im", "<|im_end|>"])
    assert detok.stop_hit == "<|im_end|>"
    assert detok.text == "hi "


def test_finish_releases_held_partial_stop():
    detok = IncrementalDetokenizer(stop=["<|eot|>"])
    assert detok.push(b"done <|eo") == "done "
    assert detok.finish() == "<|eo"
    assert not detok.stopped
    assert detok.text == "done <|eo"


def test_text_after_stop_is_dropped():
    detok = IncrementalDetokenizer(stop=["\n\n"])
    assert detok.push(b"one\n") == "one"
    assert detok.push(b"\ntwo") == ""
    assert detok.push(b"three") == ""
    assert detok.finish() == ""
    assert detok.text == "one"


def test_finish_is_idempotent_and_push_after_finish_is_an_error():
    detok = IncrementalDetokenizer()
    detok.push(b"a")
    assert detok.finish() == ""
    assert detok.finish() == ""
    with pytest.raises(RuntimeError):
        detok.push(b"b")


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError):
        IncrementalDetokenizer(stop=[""])


def test_single_string_stop_is_one_stop_not_characters():
    detok, _ = feed([b"a b c"], stop="b c")
    assert detok.stop_hit == "b c"
    assert detok.text == "a "


ALPHABET = "abc #<>/\n" + "éß日本語🦙😀\u0301" + "\x00"


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(length))


def random_pieces(rng: random.Random, data: bytes) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=rng.randint(0, len(data) - 1))) if len(data) > 1 else []
    return split_bytes(data, cuts)


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_rejoin_to_decoded_string(seed):
    rng = random.Random(seed)
    for _ in range(50):
        text = random_text(rng, rng.randint(0, 40))
        detok, deltas = feed(random_pieces(rng, text.encode()))
        assert "".join(deltas) == detok.text == text
        assert not detok.stopped


def reference_stop(text: str, stops: list[str]) -> str:
    """Text up to the first stop that completes when reading left to right."""
    for end in range(len(text) + 1):
        hits = [text.find(s) for s in stops if text.find(s) != -1 and text.find(s) + len(s) <= end]
        if hits:
            return text[: min(hits)]
    return text


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_with_stops_match_reference(seed):
    rng = random.Random(1000 + seed)
    for _ in range(50):
        text = random_text(rng, rng.randint(0, 40))
        stops = [random_text(rng, rng.randint(1, 4)) for _ in range(rng.randint(1, 3))]
        # Pieces are whole characters here, so "first stop to complete" is well defined
        # per piece; we compare against the character-by-character reference.
        pieces = [ch.encode() for ch in text]
        detok, deltas = feed(pieces, stop=stops)
        expected = reference_stop(text, stops)
        assert "".join(deltas) == detok.text == expected
        assert detok.stopped == any(s in text for s in stops)


@pytest.mark.parametrize("seed", range(20))
def test_random_byte_splits_with_stops_keep_invariants(seed):
    rng = random.Random(2000 + seed)
    for _ in range(50):
        text = random_text(rng, rng.randint(0, 40))
        stops = [random_text(rng, rng.randint(1, 4)) for _ in range(rng.randint(1, 3))]
        detok, deltas = feed(random_pieces(rng, text.encode()), stop=stops)
        assert "".join(deltas) == detok.text
        assert text.startswith(detok.text)
        assert not any(s in detok.text for s in stops)
        if detok.stopped:
            assert detok.stop_hit in stops
            assert text[len(detok.text):].startswith(detok.stop_hit)
        else:
            assert detok.text == text
