"""The tuner: search space and objective as data, benches behind one interface, optuna studies."""
