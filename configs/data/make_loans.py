"""Write loans.csv and loans_new.csv: synthetic loan applications with a known approval rule plus noise.

Each applicant has an income (log-normal around 50,000), a credit score (normal around 680,
300 to 850), a debt ratio (beta, around 0.3), an employment type and a region. The rule:

    z = 1.6·(score − 680)/60 + 1.2·ln(income/50,000)/0.4 − 1.5·(debt_ratio − 0.3)/0.12
        − 1.5·[employment = unemployed] − 0.4·[employment = self_employed]
    approved = yes when z + logistic noise > 0, else no

Region plays no part (a column a model should learn to ignore). About 3% of the income cells
are left empty (a missing value). Run it from this folder: python make_loans.py
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

ROWS = 2000
HERE = Path(__file__).resolve().parent


def applicants(n: int, rng: np.random.Generator):
    income = np.round(50_000 * np.exp(0.4 * rng.standard_normal(n)), -2)
    score = np.clip(np.round(rng.normal(680, 60, n)), 300, 850)
    ratio = np.round(rng.beta(5, 11.7, n), 3)  # mean 0.3
    employment = rng.choice(["salaried", "self_employed", "unemployed"], n, p=[0.7, 0.2, 0.1])
    region = rng.choice(["north", "south", "east", "west"], n)
    return income, score, ratio, employment, region


def rule(income, score, ratio, employment) -> np.ndarray:
    """The known part of the approval decision (its logit)."""
    return (1.6 * (score - 680) / 60 + 1.2 * np.log(income / 50_000) / 0.4 - 1.5 * (ratio - 0.3) / 0.12
            - 1.5 * (employment == "unemployed") - 0.4 * (employment == "self_employed"))


def main() -> None:
    rng = np.random.default_rng(2024)
    income, score, ratio, employment, region = applicants(ROWS, rng)
    z = rule(income, score, ratio, employment) + rng.logistic(size=ROWS)
    approved = np.where(z > 0, "yes", "no")
    income_cells = [f"{v:.0f}" for v in income]
    for i in rng.choice(ROWS, ROWS * 3 // 100, replace=False):
        income_cells[i] = ""
    with open(HERE / "loans.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["income", "credit_score", "debt_ratio", "employment", "region", "approved"])
        for row in zip(income_cells, score.astype(int), ratio, employment, region, approved):
            w.writerow(row)
    with open(HERE / "loans_new.csv", "w", newline="") as f:  # new applicants to predict, no label
        w = csv.writer(f)
        w.writerow(["income", "credit_score", "debt_ratio", "employment", "region"])
        w.writerows([[82000, 760, 0.18, "salaried", "north"], [31000, 590, 0.52, "unemployed", "east"],
                     [48000, 680, 0.30, "self_employed", "west"]])


if __name__ == "__main__":
    main()
