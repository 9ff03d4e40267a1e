"""Training jobs: ``train.py``'s job (fit the deployed blend head, save the index) and its report."""
