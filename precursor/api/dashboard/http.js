// An API answer that is no success: its HTTP status and the API's own words (its "detail").

export class HttpError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}
