"""GET /v1/files/{id}/content: the file's bytes through Starlette's FileResponse (which serves
Range requests too), except that a Range it cannot serve is refused in OpenAI's error body,
like every other refusal, instead of FileResponse's plain-text one."""
from __future__ import annotations

from starlette.responses import FileResponse, MalformedRangeHeader, RangeNotSatisfiable

from ..api_errors import ApiError


class FileContent(FileResponse):
    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        # FileResponse answers these two itself, past the app's exception handlers; raised as
        # ApiError they reach them (the response has not started yet)
        try:
            return super()._parse_range_header(http_range, file_size)
        except RangeNotSatisfiable:
            raise ApiError(416, f"the Range header asks for bytes past the end of the file ({file_size:,} bytes)",
                           code="range_not_satisfiable", headers={"Content-Range": f"bytes */{file_size}"}) from None
        except MalformedRangeHeader as exc:
            raise ApiError(400, f"the Range header cannot be served: {exc.content.rstrip('.')}",
                           code="invalid_range") from None
