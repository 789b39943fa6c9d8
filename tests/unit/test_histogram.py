from lanes.histogram import INF, bucket_label, quantile


def test_bucket_labels():
    assert bucket_label(0.0) == "0.005"
    assert bucket_label(0.005) == "0.005"
    assert bucket_label(0.0051) == "0.01"
    assert bucket_label(1e9) == INF


def test_quantile_interpolates_within_bucket():
    assert quantile({}, 0.5) is None
    counts = {"0.01": 50, "0.025": 50}
    assert abs(quantile(counts, 0.5) - 0.01) < 1e-9
    assert 0.01 < quantile(counts, 0.95) <= 0.025
