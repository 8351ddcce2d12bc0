// Risk bands: how risky a prediction is against the operating point the pipeline alerts by (the same rule as
// contracts/alerting.py), so the dashboard colours a live prediction as the pipeline judged it.

export const LEVEL_NAMES = { low: "Low", elevated: "Elevated", high: "High", critical: "Critical" };

// The rule until the fleet summary says otherwise: precursor.contracts.alerting.AlertRule's defaults.
const DEFAULT_OPERATING_POINT = { default_threshold: 0.7, threshold: null, model_thresholds: {}, clear_factor: 0.6 };

export class RiskBands {
  // threshold: a fixed threshold asked of the API (null: each machine is judged at its model's operating point);
  // operatingPoint: the fleet summary's operating_point.
  constructor(threshold = null, operatingPoint = DEFAULT_OPERATING_POINT) {
    this.threshold = threshold;
    this.operatingPoint = operatingPoint;
  }

  // The threshold a prediction of `modelName` carrying `own` is judged at.
  thresholdFor(modelName, own) {
    const op = this.operatingPoint;
    if (this.threshold !== null && this.threshold !== undefined) return this.threshold;
    if (Object.hasOwn(op.model_thresholds ?? {}, modelName)) return op.model_thresholds[modelName];
    if (op.threshold !== null && op.threshold !== undefined) return op.threshold;
    return own ?? op.default_threshold;
  }

  // high = at risk (alerts raise here), elevated = in the hysteresis gap (an alert already raised stays), low = below
  // where alerts clear; critical = high and at 90 % or more.
  level(risk, threshold) {
    if (risk >= threshold && risk >= 0.9) return "critical";
    if (risk >= threshold) return "high";
    if (risk >= threshold * this.operatingPoint.clear_factor) return "elevated";
    return "low";
  }
}
