"""The plain functions behind the notebooks: one module per notebook, named after it.

| notebook                          | module                                  |
|-----------------------------------|-----------------------------------------|
| ``00_setup_check``                | :mod:`.setup_check`                     |
| ``01_one_model_two_speeds``       | :mod:`.one_model_two_speeds`            |
| ``02_prefill_is_compute_bound``   | :mod:`.prefill_is_compute_bound`        |
| ``03_decode_is_bandwidth_bound``  | :mod:`.decode_is_bandwidth_bound`       |
| ``04_arithmetic_intensity``       | :mod:`.arithmetic_intensity`            |
| ``05_batching``                   | :mod:`.batching`, :mod:`.tensor_parallel` |
| ``06_on_your_machine``            | :mod:`.on_your_machine`                 |
| ``07_serving_economics``          | :mod:`.serving_economics`, :mod:`.serving_pools` |
| ``08_speculative_decoding``       | :mod:`.speculative_decoding`            |

:mod:`.machine` is what they share: this machine, its lesson sizes and model, record tables,
and how the notebooks show code (a kernel's body, a function or an excerpt of one).
:mod:`.claims` holds every lesson's claims as functions over measurements: each returns a
:class:`~.claims.Verdict` (the claim, whether it holds, the numbers that decided it), which the
notebook prints and asserts, and ``tests/test_claims.py`` feeds counter-data to each.

A notebook cell calls these at fixed values and ``assert``s the lesson's claim on the result;
the dashboard next to it calls the same function at whatever the slider says (the ``*_view``
functions draw a figure and return a one-line readout for ``widgets.dashboard``). Keeping them
here, not in the notebooks, means they are tested like the rest of the package.
"""
