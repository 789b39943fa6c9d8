"""``tasks.bulk``'s pure parts: its ids (version 4 UUIDs, as ``str(uuid.uuid4())`` writes them), its collector pause."""

import uuid

from tasks.bulk import new_task_ids


def test_every_id_is_a_version_4_uuid_written_as_uuid_writes_it():
    ids = new_task_ids(5000)
    assert len(ids) == 5000
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


def test_ids_differ_and_every_variant_digit_occurs():
    ids = new_task_ids(2000)
    assert len(set(ids)) == 2000
    assert {text[19] for text in ids} == set("89ab")
    assert new_task_ids(0) == []


def test_the_collector_is_paused_in_the_block_and_restored_after_even_on_error():
    import gc

    import pytest

    from tools.bulkbench import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
