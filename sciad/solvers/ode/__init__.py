"""ODE integration: the steppers `solve_ivp` and `odeint` name (`_ode_steppers`)
and the step control, floors and adjoint strategies around diffrax (`_ode`)."""
