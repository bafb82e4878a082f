"""The convolution algorithms; :mod:`clconv.plan` picks among them."""
