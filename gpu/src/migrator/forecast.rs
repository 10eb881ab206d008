//! MIGRator's arrival forecast: a small forecaster of our own in place of P0's Informer
//! transformer (§4.1: per-second arrivals of the coming window, predicted from earlier
//! windows). It sees only the arrivals observed **before** the window starts ([`forecast`]
//! takes that history and nothing else).
//!
//! **The model.** Additive Holt-Winters without trend (level and seasonal component; P0 names
//! no classical model, this is ours) when the season is known and the history holds at least
//! two of them, else simple exponential smoothing (the level alone). Its smoothing factors are
//! chosen from a small grid by backtesting on the history itself: from each earlier window
//! boundary, the forecast of the following `horizon` seconds, scored by mean absolute error
//! against what then arrived. The seasonal profile is smoothed over 9 s before it is used, so
//! that one noisy second of the last season does not carry into the forecast.
//!
//! What it cannot do, by construction: foresee a burst. A bursty trace is forecast as its
//! smoothed level (bursts included on average); a diurnal one as its level plus the shape of
//! the last seasons.

/// Level smoothing factors tried (per second).
const ALPHAS: [f64; 5] = [0.005, 0.01, 0.03, 0.1, 0.3];
/// Seasonal smoothing factors tried (per season).
const GAMMAS: [f64; 4] = [0.1, 0.3, 0.5, 0.8];
/// Half-width of the moving average the seasonal profile is smoothed with, seconds.
const SMOOTH_S: usize = 4;

/// A fitted forecaster's choice and how it did in its own backtest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Level smoothing factor.
    pub alpha: f64,
    /// Seasonal smoothing factor (0 without a season).
    pub gamma: f64,
    /// Season length used, seconds (0: none).
    pub season: usize,
    /// Mean absolute error of the backtest, requests per second.
    pub backtest_mae: f64,
}

/// The forecast of the next `horizon` seconds from `history` (per-second arrivals observed so
/// far, oldest first), with a season of `season` seconds if one is known; and the fit.
pub fn forecast(history: &[f64], season: Option<usize>, horizon: usize) -> (Vec<f64>, Fit) {
    if history.is_empty() {
        return (
            vec![0.0; horizon],
            Fit {
                alpha: 0.0,
                gamma: 0.0,
                season: 0,
                backtest_mae: 0.0,
            },
        );
    }
    let season = season
        .filter(|p| *p > 0 && history.len() >= 2 * p)
        .unwrap_or(0);
    let gammas: &[f64] = if season > 0 { &GAMMAS } else { &[0.0] };
    let mut best: Option<Fit> = None;
    for &alpha in &ALPHAS {
        for &gamma in gammas {
            let mae = backtest(history, season, horizon, alpha, gamma);
            if best.is_none_or(|b| mae < b.backtest_mae) {
                best = Some(Fit {
                    alpha,
                    gamma,
                    season,
                    backtest_mae: mae,
                });
            }
        }
    }
    let fit = best.expect("at least one candidate");
    (predict(history, season, horizon, fit.alpha, fit.gamma), fit)
}

/// Mean absolute error of forecasting `horizon` seconds from each earlier origin a multiple of
/// `horizon` before the end, with at least two seasons (or one horizon) of history before it.
fn backtest(history: &[f64], season: usize, horizon: usize, alpha: f64, gamma: f64) -> f64 {
    let min_history = (2 * season).max(horizon);
    let mut err = 0.0;
    let mut count = 0usize;
    let mut origin = history.len();
    while origin >= min_history + horizon {
        origin -= horizon;
        let f = predict(&history[..origin], season, horizon, alpha, gamma);
        for (h, v) in f.iter().enumerate() {
            err += (v - history[origin + h]).abs();
            count += 1;
        }
    }
    if count == 0 {
        // Too short to backtest: prefer slow smoothing.
        alpha + gamma
    } else {
        err / count as f64
    }
}

/// Runs the smoother over `history` and forecasts `horizon` seconds.
fn predict(history: &[f64], season: usize, horizon: usize, alpha: f64, gamma: f64) -> Vec<f64> {
    if season == 0 || history.len() < 2 * season {
        let mut level = history[..history.len().min(horizon.max(1))]
            .iter()
            .sum::<f64>()
            / history.len().min(horizon.max(1)) as f64;
        for x in history {
            level = alpha * x + (1.0 - alpha) * level;
        }
        return vec![level.max(0.0); horizon];
    }
    let first = &history[..season];
    let mut level = first.iter().sum::<f64>() / season as f64;
    let mut seasonal: Vec<f64> = first.iter().map(|x| x - level).collect();
    for (t, x) in history.iter().enumerate().skip(season) {
        let i = t % season;
        let new_level = alpha * (x - seasonal[i]) + (1.0 - alpha) * level;
        seasonal[i] = gamma * (x - new_level) + (1.0 - gamma) * seasonal[i];
        level = new_level;
    }
    let smoothed: Vec<f64> = (0..season)
        .map(|i| {
            let span = 2 * SMOOTH_S + 1;
            (0..span)
                .map(|d| seasonal[(i + season * 2 + d - SMOOTH_S) % season])
                .sum::<f64>()
                / span as f64
        })
        .collect();
    let n = history.len();
    (0..horizon)
        .map(|h| (level + smoothed[(n + h) % season]).max(0.0))
        .collect()
}

/// Mean absolute percentage error of `forecast` against `actual` (their common length), %.
pub fn mape(forecast: &[f64], actual: &[f64]) -> f64 {
    let pairs: Vec<(f64, f64)> = forecast
        .iter()
        .zip(actual)
        .filter(|(_, a)| **a > 1e-9)
        .map(|(f, a)| (*f, *a))
        .collect();
    if pairs.is_empty() {
        return 0.0;
    }
    100.0 * pairs.iter().map(|(f, a)| (f - a).abs() / a).sum::<f64>() / pairs.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_constant_is_forecast_as_itself() {
        let (f, fit) = forecast(&[50.0; 600], None, 200);
        assert!(f.iter().all(|v| (v - 50.0).abs() < 1e-9), "{f:?}");
        assert!(fit.backtest_mae < 1e-9);
    }

    #[test]
    fn a_clean_season_is_carried_forward() {
        let wave = |t: usize| 100.0 + 50.0 * (t as f64 / 100.0 * std::f64::consts::TAU).sin();
        let history: Vec<f64> = (0..1000).map(wave).collect();
        let (f, fit) = forecast(&history, Some(100), 200);
        assert_eq!(fit.season, 100);
        let actual: Vec<f64> = (1000..1200).map(wave).collect();
        // The 9 s smoothing flattens the peaks a little, nothing more.
        assert!(mape(&f, &actual) < 3.0, "{}", mape(&f, &actual));
    }

    #[test]
    fn without_two_seasons_of_history_it_falls_back_to_the_level() {
        let history: Vec<f64> = (0..150).map(|t| t as f64).collect();
        let (f, fit) = forecast(&history, Some(100), 10);
        assert_eq!(fit.season, 0);
        assert!(f.windows(2).all(|w| w[0] == w[1]));
    }
}
