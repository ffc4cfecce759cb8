"""Direct solvers: factor once, solve with the factor (dense LU and
Cholesky, SuperLU on the host, KLU and CHOLMOD compiled through XLA's FFI,
cuDSS on NVIDIA GPUs), with the host store and checks they share
(`_sparse_direct`). Each record is one file; `sciad.solvers` registers them."""
