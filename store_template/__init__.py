# The files beside this one are copied into every new store by `clagd init`.
