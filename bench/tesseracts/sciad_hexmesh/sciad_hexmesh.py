"""SIMP problems on a hexahedral mesh as sciad programs, for the Tesseract
modules that run sciad as a Mosaic solver (`../thermal-mesh`,
`../structural-mesh`).

Mosaic's mesh tasks hand every solver the same canonical inputs: a padded
HEX8 mesh (`points`, `faces` with VTK's node order, the active sizes
`n_points`, `n_faces`), a per-cell density `rho`, and boundary conditions
as node groups (`mask[i] = k >= 1`: node `i` is in group `k`, whose
prescribed value, or flux / traction, is `values[k - 1]`). This module
turns them into one sciad program per mesh:

- the element matrices of trilinear HEX8 by 2 x 2 x 2 Gauss quadrature on
  each cell's own geometry (one matrix for all cells where every cell is a
  translate of the first, as on Mosaic's structured meshes): the
  conductance `int grad N_a . grad N_b` (`components=1`), or the stiffness
  of isotropic linear elasticity with Young's modulus 1 (`components=3`);
- each cell's degrees of freedom numbered among the free ones (-1 where
  fixed), so a call traces only `E(rho_e) Ke` per cell, summed by
  `sd.sparse.assemble_elements` (the pattern and the map from element
  entries to stored ones made once per mesh), and solves it tagged `spd`;
- the load: each boundary face (a cell face no other cell shares) whose
  four nodes are all in one Neumann group takes that group's flux or
  traction times the face's area, a quarter to each node (the surface
  integral, exact on a planar parallelogram face); a per-cell volumetric
  source `s_e` gives `s_e V_e / 8` to each node of the cell (lumped, as
  Mosaic's reference); Dirichlet values are lifted into the right-hand side
  (`- K_fd u_d`, a function of `rho` too);
- the compliance `C = f_N . u` (the work of the Neumann load, prescribed
  degrees of freedom included) and, for the heat problem, Mosaic's
  identification error `sum_i (T_i - target_i)^2` over the first
  `min(n_points, len(target))` nodes.

The modulus is `E(rho) = E_min + (E_max - E_min) clip(rho, 0, 1)^p`, with
the defaults of Mosaic's tasks (heat: `k_max = 1`, `k_min = 1e-3 k_max`,
`p = 3`; elasticity: `E_max = 70e3`, `E_min = 1e-3 E_max`, `p = 3`,
`nu = 0.3`). Everything is float64 inside; Mosaic's schemas exchange
float32.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

#: the corners of the reference cube in VTK's hexahedron order
CORNERS = np.array([[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1],
                    [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1]], dtype=np.float64)
#: the six faces of a hexahedron (local node numbers, VTK order)
FACES = np.array([[0, 3, 2, 1], [4, 5, 6, 7], [0, 1, 5, 4], [1, 2, 6, 5], [2, 3, 7, 6],
                  [3, 0, 4, 7]])
_G = 1.0 / np.sqrt(3.0)
#: the 2 x 2 x 2 Gauss points (unit weights)
GAUSS = np.array([[i, j, k] for i in (-_G, _G) for j in (-_G, _G) for k in (-_G, _G)])


class Material(NamedTuple):
    """The SIMP law `E(rho) = e_min + (e_max - e_min) clip(rho, 0, 1)^p`
    (`nu`: Poisson's ratio, for elasticity)."""

    e_max: float
    e_min: float
    p: float
    nu: float = 0.3


HEAT = Material(1.0, 1e-3, 3.0)
ELASTIC = Material(70e3, 70.0, 3.0, 0.3)


def _gradients(X):
    """`(B, detJ)`: the shape functions' gradients at the Gauss points,
    `(cells, 8 points, 8 nodes, 3)`, and the Jacobian's determinant
    `(cells, 8)`, for cells with corner coordinates `X` `(cells, 8, 3)`."""
    g = GAUSS[:, None, :]                                   # (8 points, 1, 3)
    c = CORNERS[None, :, :]                                 # (1, 8 nodes, 3)
    f = 1.0 + g * c                                         # (8, 8, 3)
    dN = np.stack([c[..., 0] * f[..., 1] * f[..., 2], f[..., 0] * c[..., 1] * f[..., 2],
                   f[..., 0] * f[..., 1] * c[..., 2]], axis=-1) / 8.0   # (points, nodes, 3)
    J = np.einsum("qar,eas->eqrs", dN, X)                   # dX_s / dxi_r
    det = np.linalg.det(J)
    if np.any(det <= 0):
        bad = int(np.flatnonzero(np.any(det <= 0, axis=1))[0])
        raise ValueError(f"hex_mesh: cell {bad} is inverted or degenerate (a non-positive "
                         f"Jacobian determinant); its nodes must follow VTK's hexahedron order")
    B = np.einsum("eqsr,qar->eqas", np.linalg.inv(J), dN)   # dN_a / dX_s
    return B, det


def _elasticity(nu: float):
    """The isotropic elasticity matrix (Voigt, xx yy zz yz xz xy) for E = 1."""
    lam, mu = nu / ((1 + nu) * (1 - 2 * nu)), 1.0 / (2 * (1 + nu))
    D = np.zeros((6, 6))
    D[:3, :3] = lam
    D[np.arange(3), np.arange(3)] += 2 * mu
    D[np.arange(3, 6), np.arange(3, 6)] = mu
    return D


def element_matrices(X, components: int, nu: float = 0.3):
    """`(Ke, volume)`: each cell's element matrix `(cells, 8 c, 8 c)` for
    unit material (`components` 1: conductance; 3: elasticity, degrees of
    freedom node-major) and volume `(cells,)`."""
    B, det = _gradients(X)
    if components == 1:
        Ke = np.einsum("eq,eqas,eqbs->eab", det, B, B)
    else:
        e, q = B.shape[:2]
        S = np.zeros((e, q, 6, 8, 3))  # strain-displacement, (Voigt, node, component)
        for s in range(3):
            S[:, :, s, :, s] = B[..., s]
        for v, (i, j) in zip(range(3, 6), ((1, 2), (0, 2), (0, 1))):
            S[:, :, v, :, i] = B[..., j]
            S[:, :, v, :, j] = B[..., i]
        S = S.reshape(e, q, 6, 24)
        Ke = np.einsum("eq,eqvi,vw,eqwj->eij", det, S, _elasticity(nu), S)
    return Ke, det.sum(axis=1)


def _groups(bc, n: int, components: int, what: str):
    """`(mask (n,), values (groups, components) or None)` of a Dirichlet or
    Neumann record (a dict, or None)."""
    if not bc:
        return np.zeros(n, np.int64), None
    mask = np.zeros(n, np.int64)
    given = np.asarray(bc.get("mask", []), np.int64)[:n]
    mask[:given.size] = given
    values = bc.get("values")
    if values is None:
        return mask, None
    values = np.asarray(values, np.float64).reshape(-1, components) \
        if np.size(values) else np.zeros((0, components))
    if mask.max(initial=0) > values.shape[0]:
        raise ValueError(f"boundary_conditions.{what}: the mask names group "
                         f"{int(mask.max())} but `values` has {values.shape[0]} rows; give "
                         f"one row of {components} value(s) per group")
    return mask, values


class HexProblem:
    """One mesh and its boundary conditions, built once (see the module
    docstring): `solve(rho, source, material)` is the sciad program."""

    def __init__(self, points, cells, bc: dict, components: int, nu: float = 0.3):
        points = np.asarray(points, np.float64)
        cells = np.asarray(cells, np.int64)
        if cells.ndim != 2 or cells.shape[1] != 8:
            raise ValueError(f"hex_mesh.faces: expected (n_faces, 8) node numbers, got shape "
                             f"{cells.shape}")
        if cells.size and (cells.min() < 0 or cells.max() >= points.shape[0]):
            raise ValueError(f"hex_mesh.faces: node numbers must lie in [0, n_points = "
                             f"{points.shape[0]}); got [{cells.min()}, {cells.max()}]")
        c, n, m = components, points.shape[0], cells.shape[0]
        self.components, self.n_nodes, self.n_cells = c, n, m
        X = points[cells]                                          # (m, 8, 3)
        rel = X - X[:, :1]
        same = bool(np.allclose(rel, rel[:1], rtol=0.0, atol=1e-9 * np.ptp(points)))
        Ke, vol = element_matrices(X[:1] if same else X, c, nu)
        self.Ke = Ke                                  # (1 or m, 8c, 8c)
        volume = np.broadcast_to(vol, (m,)) if same else vol
        dofs = (cells[:, :, None] * c + np.arange(c)).reshape(m, 8 * c)   # (m, 8c)

        # Dirichlet: every component of a marked node, at its group's value
        dmask, dvals = _groups(bc.get("dirichlet"), n, c, "dirichlet")
        fixed = np.repeat(dmask > 0, c)
        u_d = np.zeros(n * c)
        if dvals is not None:
            marked = np.flatnonzero(dmask > 0)
            u_d.reshape(n, c)[marked] = dvals[dmask[marked] - 1]
        free = np.flatnonzero(~fixed)
        number = np.full(n * c, -1, np.int64)
        number[free] = np.arange(free.size)
        local = number[dofs]                                       # (m, 8c), -1: fixed
        self.local = local  # (what sciad's assembly takes: the fixed rows dropped)
        self.free, self.u_d = free, u_d

        # the Neumann load on boundary faces, and the lifting of u_d
        self.f_n = self._neumann(points, cells, bc.get("neumann"))
        self.lift = None
        if np.any(u_d != 0):
            ud = u_d[dofs]                                          # (m, 8c)
            per = np.einsum("eij,ej->ei", np.broadcast_to(Ke, (m,) + Ke.shape[1:]), ud)
            ok = local >= 0
            self.lift = sp.csr_matrix((per[ok], (local[ok], np.nonzero(ok)[0])),
                                      shape=(free.size, m))
        # a node's lumped source (heat): s_e V_e / 8 to each node of cell e
        if c == 1:
            self.source_map = sp.csr_matrix(
                (np.repeat(volume / 8.0, 8), (cells.ravel(), np.repeat(np.arange(m), 8))),
                shape=(n, m))[free]
        self.embed = sp.csr_matrix((np.ones(free.size), (free, np.arange(free.size))),
                                   shape=(n * c, free.size))

    def _neumann(self, points, cells, bc):
        c, n = self.components, self.n_nodes
        f = np.zeros(n * c)
        mask, values = _groups(bc, n, c, "neumann")
        if values is None or not np.any(mask):
            return f
        quads = cells[:, FACES].reshape(-1, 4)                     # (6m, 4)
        key = np.sort(quads, axis=1)
        _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        boundary = quads[counts[inverse.ravel()] == 1]
        g = mask[boundary]
        loaded = boundary[np.all(g == g[:, :1], axis=1) & (g[:, 0] > 0)]
        if loaded.size == 0:
            return f
        P = points[loaded]                                         # (k, 4, 3)
        area = 0.5 * np.linalg.norm(np.cross(P[:, 2] - P[:, 0], P[:, 3] - P[:, 1]), axis=1)
        t = values[mask[loaded[:, 0]] - 1]                          # (k, c)
        share = (area[:, None] * t / 4.0)                           # (k, c)
        np.add.at(f.reshape(n, c), loaded.ravel(), np.repeat(share, 4, axis=0))
        return f

    # --- the sciad program ---

    def displacement(self, rho, material: Material, source=None):
        """The full solution `u` (all degrees of freedom, node-major), a
        sciad function of the per-cell density (and, for heat, of the
        per-cell source)."""
        import sciad as sd
        import sciad.numpy as snp

        E = material.e_min + (material.e_max - material.e_min) * \
            snp.clip(rho, 0.0, 1.0) ** material.p
        A = sd.sparse.assemble_elements(E[:, None, None] * self.Ke, self.local,
                                        shape=(self.free.size,) * 2, tags=["spd"])
        b = self.f_n[self.free]
        if source is not None:
            b = b + sd.sparse.from_scipy(self.source_map) @ source
        if self.lift is not None:
            b = b - sd.sparse.from_scipy(self.lift) @ E
        u = sd.linalg.solve(A, b)
        return sd.sparse.from_scipy(self.embed) @ u + self.u_d

    def compliance(self, u):
        """`C = f_N . u`."""
        import sciad.numpy as snp

        return snp.dot(self.f_n, u)


#: the problems built, by a digest of the mesh and boundary conditions
_PROBLEMS: OrderedDict = OrderedDict()
_KEEP = 4


def _digest(*arrays) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def problem_for(hex_mesh: dict, bc: dict, components: int, nu: float = 0.3) -> HexProblem:
    """The `HexProblem` of a Mosaic input's mesh (its active slices) and
    boundary conditions, built once per distinct mesh (the last few kept)."""
    n, m = int(hex_mesh["n_points"]), int(hex_mesh["n_faces"])
    points = np.asarray(hex_mesh["points"], np.float64)
    cells = np.asarray(hex_mesh["faces"], np.int64)
    n = n or points.shape[0]
    m = m or cells.shape[0]
    points, cells = points[:n], cells[:m]
    parts = [points, cells, np.asarray([components, nu])]
    for kind in ("dirichlet", "neumann"):
        rec = (bc or {}).get(kind) or {}
        parts += [np.asarray(rec.get("mask", []), np.int64),
                  np.asarray(rec.get("values") if rec.get("values") is not None else [],
                             np.float64)]
    key = _digest(*parts)
    if key not in _PROBLEMS:
        _PROBLEMS[key] = HexProblem(points, cells, bc or {}, components, nu)
        while len(_PROBLEMS) > _KEEP:
            _PROBLEMS.popitem(last=False)
    _PROBLEMS.move_to_end(key)
    return _PROBLEMS[key]


def active(x, m: int) -> np.ndarray:
    """The first `m` entries of a padded per-cell field, float64."""
    x = np.asarray(x, np.float64).ravel()
    if x.size < m:
        raise ValueError(f"a per-cell field needs at least n_faces = {m} entries, got "
                         f"{x.size}")
    return x[:m]


def padded(g, size: int) -> np.ndarray:
    """`g` in a float32 array of `size` (zeros past it): a cotangent for a
    padded input."""
    out = np.zeros(size, np.float32)
    out[:g.shape[0]] = np.asarray(g, np.float32)
    return out


# --- Mosaic's canonical mesh schemas (field names, shapes and dtypes of
# `mosaic_shared.schema_types`, v0.2.0), for the Tesseract modules ---

try:
    from pydantic import BaseModel
    from tesseract_core.runtime import Array, Float32, Int32
except ImportError:  # (the physics above needs neither)
    BaseModel = None

if BaseModel is not None:
    class HexMesh(BaseModel):
        """A padded hexahedral mesh: `points[:n_points]`, `faces[:n_faces]`
        (VTK's node order) are the active parts."""

        points: Array[(None, 3), Float32]
        faces: Array[(None, 8), Int32]
        n_points: Int32 = 0
        n_faces: Int32 = 0

    class MeshDirichletBC(BaseModel):
        """Prescribed values by node group (`values` None: zero)."""

        mask: Array[(None,), Int32]
        values: Array[(None, None), Float32] | None = None

    class MeshNeumannBC(BaseModel):
        """Prescribed flux or traction by node group."""

        mask: Array[(None,), Int32]
        values: Array[(None, None), Float32]

    class MeshBC(BaseModel):
        """A mesh task's boundary conditions."""

        dirichlet: MeshDirichletBC | None = None
        neumann: MeshNeumannBC | None = None


def float64(endpoint):
    """An endpoint run with JAX's 64-bit types on, whatever the process's
    configuration (a scope: the module leaves the global one alone)."""
    import functools

    @functools.wraps(endpoint)
    def run(*args, **kwargs):
        import jax

        with jax.enable_x64(True):
            return endpoint(*args, **kwargs)

    return run


def check_names(task: str, inputs, outputs, known_inputs, known_outputs) -> None:
    """Refuses differentiation names a Tesseract module does not have."""
    bad_in = set(inputs) - set(known_inputs)
    bad_out = set(outputs) - set(known_outputs)
    if bad_in or bad_out:
        raise ValueError(f"{task} (sciad): the differentiable inputs are {tuple(known_inputs)} "
                         f"and outputs {tuple(known_outputs)}; got inputs {sorted(bad_in)} and "
                         f"outputs {sorted(bad_out)} besides")
