"""The records inside supervisor-worker messages: written by one end, read by the other under one name."""
from jevany_daemon import channel


def test_a_hand_over_reads_back_field_by_field_and_a_shorter_one_reads_none_for_what_it_left_off():
    item = channel.HandedOver(7, b"\x81\xa1v\x01", "http", [["image", "/r/a.png", [3, "ab"]]], 0.25, "t" * 32, 12.5)
    [kind, [got], seq] = channel.decode(channel.encode(channel.BATCH, [item], 3))
    assert (kind, seq) == (channel.BATCH, 3) and channel.HandedOver.read(got) == item
    assert channel.HandedOver.read([8, b"x"]) == channel.HandedOver(8, b"x", None, None, None, None, None)


def test_answers_and_pass_records_read_back_by_name():
    answer = channel.Answer(7, False, {"code": "internal", "message": "m", "retryable": False})
    record = channel.PassRecord(4, 512, 300, 12.5, True, ["zmq", "http"])
    [kind, [got_answer], stats, [got_record], seq] = channel.decode(
        channel.encode(channel.RESULTS, [answer], {}, [record], 1))
    assert channel.Answer._make(got_answer) == answer
    assert channel.PassRecord.read(got_record) == record and channel.PassRecord.read(got_record).origins == ["zmq", "http"]
    assert channel.PassRecord.read([1, 2, 3, 4.0]).ok is False     # an older record without ok and origins
