"""Import paths -> Functions and callables; binding spec arguments to forward's signature.

One precise message per failure (the user's real import error, where it happened, did-you-mean
for attributes), and every Function style users write must bind and pass the check.
"""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch

import gradcheck_cli
from gradcheck_cli.sandbox.errors import BindError, LoadError
from gradcheck_cli.subject import loader
from gradcheck_cli.subject.binding import bind

FUNCTIONS = """
    import torch

    CONSTANT = 3


    class Plain:
        pass


    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g


    class Outer:
        class Inner(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return 3 * x

            @staticmethod
            def backward(ctx, g):
                return 3 * g


    class ForwardOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x


    class Layer(torch.nn.Module):
        def forward(self, x):
            return x


    class SumDim(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dim=-1, keepdim=False):
            ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
            return x.sum(dim=dim, keepdim=keepdim)

        @staticmethod
        def backward(ctx, g):
            g = g if ctx.keepdim else g.unsqueeze(ctx.dim)
            return g.expand(ctx.shape), None, None


    class Scale(torch.autograd.Function):
        \"\"\"forward + setup_context, with defaults: y = x * w * scale + shift.\"\"\"

        @staticmethod
        def forward(x, w, scale=1.0, shift=0.0):
            return x * w * scale + shift

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, w, scale, shift = inputs
            ctx.save_for_backward(x, w)
            ctx.scale = scale

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g * w * ctx.scale, g * x * ctx.scale, None, None


    class ClassForward(torch.autograd.Function):
        \"\"\"forward written as a classmethod: y = x ** power.\"\"\"

        @classmethod
        def forward(cls, ctx, x, power=2):
            ctx.save_for_backward(x)
            ctx.power = power
            return x ** power

        @classmethod
        def backward(cls, ctx, g):
            (x,) = ctx.saved_tensors
            return g * ctx.power * x ** (ctx.power - 1), None


    class KeywordOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *, scale=2.0):
            ctx.scale = scale
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g * ctx.scale


    class IgnoresScale(torch.autograd.Function):
        \"\"\"Wrong whenever scale != 1: backward forgets it.\"\"\"

        @staticmethod
        def forward(ctx, x, scale=1.0):
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g, None


    def weighted(x, y, scale=1.0, *, mode="sum"):
        out = x * y * scale
        return out.sum() if mode == "sum" else out.mean()


    def anything(x, **options):
        return x * options.get("factor", 1.0)
"""


@pytest.fixture
def mod(user_module) -> str:
    """The name of a user module holding the Functions above."""
    return user_module(FUNCTIONS, "userfns")


def load_error(path: str) -> LoadError:
    with pytest.raises(LoadError) as info:
        loader.load(path)
    return info.value


def bind_error(target, positional, keywords) -> BindError:
    with pytest.raises(BindError) as info:
        bind(target, positional, keywords)
    return info.value


_SEEDS = itertools.count(1)


def t(*shape, requires_grad=True) -> torch.Tensor:
    """A float64 leaf tensor; every call draws different values."""
    gen = torch.Generator().manual_seed(next(_SEEDS))
    return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_(requires_grad)


# ----------------------------------------------------------------------- loading


def test_colon_and_dotted_forms_load_the_same_function(mod):
    a = loader.load(f"{mod}:Double")
    b = loader.load(f"{mod}.Double")
    assert a.obj is b.obj
    assert a.obj.__name__ == "Double" and a.is_function
    assert a.path == f"{mod}:Double"


def test_function_in_a_package(user_module):
    user_module(
        """
        import torch

        class Neg(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return -x

            @staticmethod
            def backward(ctx, g):
                return -g
    """,
        "mypkg.sub.ops",
    )
    a = loader.load("mypkg.sub.ops:Neg")
    b = loader.load("mypkg.sub.ops.Neg")
    assert a.obj is b.obj and a.is_function


def test_nested_attribute_via_colon(mod):
    target = loader.load(f"{mod}:Outer.Inner")
    assert target.is_function and target.obj.__qualname__ == "Outer.Inner"


def test_plain_callables_load_as_callables(mod):
    erf = loader.load("torch.special.erf")
    assert erf.obj is torch.special.erf and not erf.is_function
    assert loader.load("torch.special:erf").obj is torch.special.erf
    fn = loader.load(f"{mod}:weighted")
    assert not fn.is_function and fn.obj.__name__ == "weighted"


def test_example_function_of_the_package_loads():
    target = loader.load("gradcheck_cli.examples.styles:SumDim")
    assert target.is_function and [p.name for p in target.parameters()] == ["x", "dim", "keepdim"]


@pytest.mark.parametrize("path", ["Double", "userfns:", ":Double", ""])
def test_not_an_import_path(mod, path):
    err = load_error(path)
    assert "pkg.mod:Name" in str(err)


def test_module_not_importable_names_the_module_and_says_what_to_do(user_module):
    user_module("")  # puts tmp_path on sys.path and cleans up, like the other tests
    err = load_error("no_such_module_xyz:Fn")
    msg = str(err)
    assert "'no_such_module_xyz'" in msg
    assert "spelling" in msg or "install" in msg


def test_missing_submodule_of_an_existing_package_names_the_submodule(user_module):
    user_module("X = 1\n", "realpkg.present")
    msg = str(load_error("realpkg.absent:Fn"))
    assert "realpkg.absent" in msg
    assert "spelling" in msg or "install" in msg


def test_missing_dependency_inside_the_user_module_shows_the_real_error(user_module):
    name = user_module("""
        import os
        import torch
        import not_installed_dep

        class Fn(torch.autograd.Function):
            pass
    """)
    err = load_error(f"{name}:Fn")
    msg = str(err)
    assert "No module named 'not_installed_dep'" in msg
    assert f"'{name}'" in msg
    assert f"no module named '{name}'" not in msg.lower()  # the user's module exists; its import is broken
    assert err.where is not None and err.where.startswith(f"{name}.py:4")
    assert "import not_installed_dep" in err.where


def test_import_error_for_a_missing_name_inside_the_user_module(user_module):
    name = user_module("""
        from os.path import no_such_helper
    """)
    err = load_error(f"{name}:Fn")
    assert "no_such_helper" in str(err)
    assert err.where is not None and err.where.startswith(f"{name}.py:2")


def test_dependency_missing_in_a_package_module(user_module):
    user_module("from . import helpers\n", "brokenpkg.ops")
    user_module("import not_installed_dep_2\n", "brokenpkg.helpers")
    err = load_error("brokenpkg.ops:Fn")
    assert "not_installed_dep_2" in str(err)
    assert err.where is not None and err.where.startswith("brokenpkg/helpers.py:1")


def test_syntax_error_in_the_user_module_names_file_and_line(user_module):
    name = user_module("""\
        import torch

        def broken(:
            pass
    """)
    msg = str(load_error(f"{name}:Fn"))
    assert "SyntaxError" in msg
    assert f"{name}.py" in msg and "line 3" in msg


def test_syntax_error_where_points_at_the_bad_line(user_module):
    # `where` is how results and reporters locate user errors; for a SyntaxError the place is known
    name = user_module("""\
        import torch

        def broken(:
            pass
    """)
    err = load_error(f"{name}:Fn")
    assert err.where is not None and err.where.startswith(f"{name}.py:3")


def test_exception_at_import_is_reported_with_where(user_module):
    name = user_module("""\
        import torch
        SIZE = 3
        raise RuntimeError("cannot configure the kernel")
    """)
    err = load_error(f"{name}:Fn")
    assert "RuntimeError: cannot configure the kernel" in str(err)
    assert err.where is not None and err.where.startswith(f"{name}.py:3")
    assert "raise RuntimeError" in err.where


def test_no_such_attribute_suggests_close_names(mod):
    msg = str(load_error(f"{mod}:Dubble"))
    assert f"'{mod}' has no attribute 'Dubble'" in msg
    assert "did you mean" in msg and "'Double'" in msg


def test_no_such_attribute_in_dotted_form(mod):
    msg = str(load_error(f"{mod}.SumDimm"))
    assert "'SumDimm'" in msg and "'SumDim'" in msg


def test_no_such_attribute_without_close_names_has_no_suggestion(mod):
    msg = str(load_error(f"{mod}:Zzzzzzzz"))
    assert "'Zzzzzzzz'" in msg and "did you mean" not in msg


def test_missing_nested_attribute_names_its_owner(mod):
    msg = str(load_error(f"{mod}:Outer.Innr"))
    assert f"'{mod}.Outer' has no attribute 'Innr'" in msg
    assert "'Inner'" in msg


def test_not_callable(mod):
    msg = str(load_error(f"{mod}:CONSTANT"))
    assert f"'{mod}:CONSTANT'" in msg
    assert "int" in msg and "callable" in msg and "Function" in msg


def test_class_that_is_neither_function_nor_module(mod):
    msg = str(load_error(f"{mod}:Plain"))
    assert f"'{mod}:Plain'" in msg and "class" in msg and "autograd.Function" in msg


def test_function_without_backward_says_how_to_write_one(mod):
    msg = str(load_error(f"{mod}:ForwardOnly"))
    assert f"'{mod}:ForwardOnly'" in msg
    assert "backward" in msg and "def backward(ctx" in msg


def test_nn_module_class_loads_as_a_module_with_forward_parameters_without_self(mod):
    target = loader.load(f"{mod}:Layer")
    assert target.is_module and not target.is_function and target.obj.__name__ == "Layer"
    assert names_of(target) == ["x"]


def test_nn_module_class_without_forward_says_how_to_write_one(user_module):
    name = user_module("""
        import torch

        class NoForward(torch.nn.Module):
            pass
    """)
    msg = str(load_error(f"{name}:NoForward"))
    assert f"'{name}:NoForward'" in msg and "nn.Module" in msg and "def forward(self" in msg


def test_load_errors_from_a_module_are_not_raised_as_other_exceptions(user_module):
    name = user_module("raise SystemError('odd')\n")
    assert "SystemError" in str(load_error(f"{name}:Fn"))


# ----------------------------------------------------------------------- parameters and bind


def names_of(target) -> list[str]:
    return [p.name for p in target.parameters()]


def test_staticmethod_forward_parameters_exclude_ctx(mod):
    assert names_of(loader.load(f"{mod}:SumDim")) == ["x", "dim", "keepdim"]


def test_setup_context_forward_parameters_have_no_ctx(mod):
    assert names_of(loader.load(f"{mod}:Scale")) == ["x", "w", "scale", "shift"]


def test_classmethod_forward_parameters_exclude_cls_and_ctx(mod):
    assert names_of(loader.load(f"{mod}:ClassForward")) == ["x", "power"]


def test_bind_positional_takes_names_from_forward(mod):
    target = loader.load(f"{mod}:Scale")
    x, w = t(3), t(3)
    bound = bind(target, [(None, x), ("weights", w)], [])
    assert bound.values[0] is x and bound.values[1] is w
    assert bound.names == ["x", "weights"]  # a spec name wins over forward's
    assert bound.indices == [0, 1] and bound.n_positional == 2


def test_bind_leaves_trailing_defaults_to_forward(mod):
    target = loader.load(f"{mod}:SumDim")
    x = t(2, 3)
    bound = bind(target, [(None, x)], [])
    assert bound.values == [x] and bound.names == ["x"]
    assert torch.equal(target.call(bound.values, bound.n_positional, bound.kw_names), x.sum(-1))


def test_keyword_goes_to_its_slot_and_skipped_defaults_are_filled(mod):
    target = loader.load(f"{mod}:SumDim")
    x = t(2, 3)
    bound = bind(target, [(None, x)], [("keepdim", True)])
    assert bound.values[0] is x and bound.values[1:] == [-1, True]
    assert bound.names == ["x", "dim", "keepdim"]
    assert bound.indices == [0, 1, 2]
    assert bound.n_positional == 3 and bound.kw_names == []
    out = target.call(bound.values, bound.n_positional, bound.kw_names)
    assert out.shape == (2, 1) and torch.equal(out, x.sum(-1, keepdim=True))


def test_keywords_in_any_order_land_in_their_slots(mod):
    target = loader.load(f"{mod}:Scale")
    x, w = t(3), t(3)
    bound = bind(target, [(None, x)], [("shift", 0.5), ("w", w)])
    assert bound.values[:2] == [x, w] and bound.values[2:] == [1.0, 0.5]
    assert bound.names == ["x", "w", "scale", "shift"]


def test_keyword_given_twice(mod):
    target = loader.load(f"{mod}:SumDim")
    err = bind_error(target, [(None, t(2)), (None, 0)], [("dim", 1)])
    assert err.key == "kwargs.dim"
    assert "twice" in str(err) and "inputs[1]" in str(err)


def test_unknown_keyword_lists_the_parameters(mod):
    target = loader.load(f"{mod}:SumDim")
    err = bind_error(target, [(None, t(2))], [("axis", 0)])
    assert err.key == "kwargs.axis"
    msg = str(err)
    assert "'axis'" in msg and "x, dim, keepdim" in msg


def test_too_many_inputs(mod):
    target = loader.load(f"{mod}:SumDim")
    err = bind_error(target, [(None, t(2)), (None, 0), (None, False), (None, 1)], [])
    assert err.key == "inputs"
    msg = str(err)
    assert "4" in msg and "3" in msg and "x, dim, keepdim" in msg


def test_keyword_only_parameter_of_a_function_forward(mod):
    target = loader.load(f"{mod}:KeywordOnly")
    err = bind_error(target, [(None, t(2))], [("scale", 3.0)])
    assert err.key == "kwargs.scale"
    assert "keyword-only" in str(err) and "positional" in str(err)


def test_required_parameter_before_a_keyword_must_be_given(mod):
    target = loader.load(f"{mod}:Scale")
    err = bind_error(target, [(None, t(3))], [("shift", 1.0)])
    assert err.key == "inputs"
    assert "'w'" in str(err)


def test_plain_builtin_callable_binds_positionally(mod):
    target = loader.load("torch.special.erf")
    x = t(4)
    bound = bind(target, [(None, x)], [])
    assert bound.values == [x] and bound.n_positional == 1
    assert torch.equal(target.call(bound.values, bound.n_positional, bound.kw_names), torch.special.erf(x))


def test_plain_function_keeps_keywords_as_keywords(mod):
    target = loader.load(f"{mod}:weighted")
    x, y = t(3), t(3)
    bound = bind(target, [(None, x), (None, y)], [("mode", "mean"), ("scale", 2.0)])
    assert bound.n_positional == 2
    assert bound.kw_names == ["mode", "scale"]
    assert bound.names == ["x", "y", "mode", "scale"]
    assert bound.indices[:2] == [0, 1] and bound.indices[3] == 2  # scale is forward's 3rd parameter
    out = target.call(bound.values, bound.n_positional, bound.kw_names)
    assert torch.allclose(out, (x * y * 2.0).mean())


def test_plain_function_unknown_keyword(mod):
    target = loader.load(f"{mod}:weighted")
    err = bind_error(target, [(None, t(3)), (None, t(3))], [("mdoe", "mean")])
    assert err.key == "kwargs.mdoe"
    assert "x, y, scale, mode" in str(err)


def test_plain_function_with_var_keywords_accepts_any_keyword(mod):
    target = loader.load(f"{mod}:anything")
    x = t(3)
    bound = bind(target, [(None, x)], [("factor", 3.0)])
    assert torch.equal(target.call(bound.values, bound.n_positional, bound.kw_names), x * 3.0)


def test_plain_function_keyword_given_twice(mod):
    target = loader.load(f"{mod}:weighted")
    err = bind_error(target, [(None, t(3)), (None, t(3))], [("y", t(3))])
    assert err.key == "kwargs.y" and "twice" in str(err)


# ----------------------------------------------------------------------- end to end through the library API


def _import(mod: str):
    return importlib.import_module(mod)


def test_check_passes_a_staticmethod_function(mod):
    result = gradcheck_cli.check(_import(mod).Double, [t(4)])
    assert result.error is None and result.status.value == "pass"


def test_check_passes_a_classmethod_forward_with_a_keyword(mod):
    result = gradcheck_cli.check(_import(mod).ClassForward, [t(4)], kwargs={"power": 3})
    assert result.error is None, result.error
    assert result.status.value == "pass"
    assert [(r.name, r.index) for r in result.checks[0].inputs][0] == ("x", 0)


def test_check_passes_setup_context_with_a_skipped_default(mod):
    # shift given by keyword: scale (skipped) must be filled with its default 1.0
    result = gradcheck_cli.check(_import(mod).Scale, [t(3)], kwargs={"w": t(3), "shift": 0.5})
    assert result.error is None, result.error
    assert result.status.value == "pass"
    names = [r.name for r in result.checks[0].inputs]
    assert names[:2] == ["x", "w"]


def test_check_passes_setup_context_with_all_arguments_by_keyword(mod):
    result = gradcheck_cli.check(_import(mod).Scale, [t(2, 3)], kwargs={"w": t(2, 3), "scale": 2.5})
    assert result.error is None and result.status.value == "pass"


def test_check_passes_default_arguments_with_keywords(mod):
    result = gradcheck_cli.check(_import(mod).SumDim, [t(2, 3, 4)], kwargs={"keepdim": True})
    assert result.error is None and result.status.value == "pass"
    result = gradcheck_cli.check(_import(mod).SumDim, [t(2, 3, 4)], kwargs={"dim": 1})
    assert result.error is None and result.status.value == "pass"


def test_check_passes_plain_callables(mod):
    assert gradcheck_cli.check(torch.special.erf, [t(5)]).status.value == "pass"
    result = gradcheck_cli.check(_import(mod).weighted, [t(3), t(3)], kwargs={"scale": 2.0, "mode": "mean"})
    assert result.error is None and result.status.value == "pass"


def test_keywords_really_reach_forward(mod):
    # IgnoresScale is right at scale=1 and wrong otherwise: the verdict must follow the keyword
    fn = _import(mod).IgnoresScale
    assert gradcheck_cli.check(fn, [t(3)]).status.value == "pass"
    assert gradcheck_cli.check(fn, [t(3)], kwargs={"scale": 1.0}).status.value == "pass"
    assert gradcheck_cli.check(fn, [t(3)], kwargs={"scale": 3.0}).status.value == "fail"


def test_check_reports_bind_errors_as_results(mod):
    result = gradcheck_cli.check(_import(mod).KeywordOnly, [t(3)], kwargs={"scale": 3.0})
    assert result.status.value == "error"
    assert "keyword-only" in result.error.message and "kwargs.scale" in result.error.message
    result = gradcheck_cli.check(_import(mod).SumDim, [t(3)], kwargs={"axis": 0})
    assert result.status.value == "error" and "axis" in result.error.message
