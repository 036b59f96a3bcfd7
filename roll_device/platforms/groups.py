"""Named groups of `Platform` members, reached from a platform as torch.cuda reaches `memory` and
`nvtx`: `platform.env`, `platform.kernels`, `platform.memory`, `platform.profiling`,
`platform.determinism`, `platform.facts`, `platform.topology`, `platform.runtime` (docs/platforms.md,
"Groups").

A group is one class in one file, holding the porting helpers of one concern and a reference to its
platform. A kind changes a group by naming its own subclass on its platform class
(`memory = group(CudaMemory)`); plugin kinds fill the same groups the same way. A member the kind
cannot serve raises `NotImplementedError` naming the platform and the member (`memory.ipc_collect`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, TypeVar, overload

if TYPE_CHECKING:
    from roll_device.platforms.base import Platform

G = TypeVar("G", bound="PlatformGroup")


class PlatformGroup:
    """Members of one concern of `platform`; subclasses set `attribute`, the name it is reached by."""

    attribute: ClassVar[str]

    def __init__(self, platform: Platform) -> None:
        self.platform = platform

    def __repr__(self) -> str:
        return f"<{self.attribute} of {self.platform!r}>"

    def _unsupported(self, member: str, why: str = "") -> NoReturn:
        self.platform._unsupported(f"{self.attribute}.{member}", why)

    def _call(self, member: str, torch_name: str, *args: Any, **kwargs: Any) -> Any:
        """`torch.<device>.<torch_name>(...)` for this group's `member`."""
        return self.platform._call_as(f"{self.attribute}.{member}", torch_name, *args, **kwargs)

    def _index(self, index: int | None) -> int:
        return self.platform.current_device() if index is None else index


class group(Generic[G]):  # lower case: it is used like `property`, on a class body
    """A class attribute that gives each platform its own instance of the group class `cls`; read
    on the platform class, it is `cls` itself (`CudaPlatform.memory is CudaMemory`)."""

    def __init__(self, cls: type[G]) -> None:
        self.cls = cls

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.cls.attribute:
            raise TypeError(
                f"{owner.__name__}.{name} holds group '{self.cls.attribute}': name it {self.cls.attribute}"
            )

    @overload
    def __get__(self, platform: None, owner: type) -> type[G]: ...

    @overload
    def __get__(self, platform: object, owner: type) -> G: ...

    def __get__(self, platform, owner):
        if platform is None:
            return self.cls
        # Kept on the instance, which Python then reads before this (non-data) descriptor.
        made = platform.__dict__[self.cls.attribute] = self.cls(platform)
        return made
