"""The statistics the experiments write in their tables, against scipy and hand-computed values."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from attnlab.metrics.significance import (
    describe_z,
    mean_se,
    paired_z,
    two_proportion_z,
    wilson_interval,
)


def test_mean_se_is_the_sample_standard_deviation_over_root_n():
    values = [1.0, 2.0, 4.0, 7.0]
    mean, se = mean_se(values)
    assert mean == pytest.approx(3.5)
    assert se == pytest.approx(stats.sem(values))
    assert math.isnan(mean_se([3.0])[1])
    with pytest.raises(ValueError, match="at least one"):
        mean_se([])


@pytest.mark.parametrize(("k", "n"), [(1360, 2000), (0, 50), (50, 50), (7, 13)])
def test_wilson_interval_equals_scipys(k, n):
    expected = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(k, n, z=stats.norm.ppf(0.975))
    assert lo == pytest.approx(expected.low, abs=1e-12)
    assert hi == pytest.approx(expected.high, abs=1e-12)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(5, 4)


def test_two_proportion_z_squared_is_the_uncorrected_chi_square():
    # the example: 68.0 % vs 66.0 % of 2,000 characters is about 1.3 standard errors
    z = two_proportion_z(1360, 2000, 1320, 2000)
    assert z == pytest.approx(1.34, abs=0.01)
    table = [[1360, 640], [1320, 680]]
    chi2 = stats.chi2_contingency(table, correction=False).statistic
    assert z**2 == pytest.approx(chi2)
    assert two_proportion_z(1320, 2000, 1360, 2000) == pytest.approx(-z)  # the sign is p1 − p2
    assert two_proportion_z(10, 10, 5, 5) == 0.0  # both 100 %: no spread, no evidence
    with pytest.raises(ValueError, match="counts within samples"):
        two_proportion_z(3, 2, 1, 2)


def test_paired_z_is_the_one_sample_t_statistic_of_the_differences():
    diffs = [1, 0, 0, 1, -1, 1, 0, 1, 1, 0]
    assert paired_z(diffs) == pytest.approx(stats.ttest_1samp(diffs, 0.0).statistic)
    assert paired_z([0.0, 0.0]) == 0.0 and paired_z([0.5, 0.5]) == math.inf
    with pytest.raises(ValueError, match="at least two"):
        paired_z([1.0])


def test_describe_z_names_the_two_sided_confidence():
    assert describe_z(1.3) == "z = 1.3, not significant at 95 %"
    assert describe_z(-2.0).endswith("95 % confident of the sign")
    assert describe_z(3.0).endswith("99 % confident of the sign")
