"""Tasks and models on data that packages ship (no downloads): scikit-learn's digits, diabetes and
breast cancer, a generated sparse regression, and small reference models."""

from __future__ import annotations

from .digits import DataSplit, digits_data, mlp
from .ridge import ridge_closed_form_hypergradient, ridge_problem

__all__ = ["DataSplit", "digits_data", "mlp", "ridge_problem", "ridge_closed_form_hypergradient"]
