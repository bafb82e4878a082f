"""clconv's applications, apart from the library and built on its public API only: the command
line (:mod:`clconv.apps.cli`, ``python -m clconv``), the demonstration (:mod:`clconv.apps.demo`,
``python -m clconv.demo``) and the digits training example (:mod:`clconv.apps.digits`,
``python -m clconv train-digits``, under ``mpiexec`` too)."""
